"""The ROS-free frame loop: next job, plan (k, language cadence), staleness, input fitting, failures."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

from oxygen_ros.core.engine import Engine, EngineConfig, FrameResult
from oxygen_ros.core.frame_loop import Arrival, FrameLoop, LoopSettings
from oxygen_ros.core.input_fit import CHARS_PER_TOKEN, InstructionFitter, fit_question
from oxygen_ros.core.observation import Observation, ObservationError
from oxygen_ros.core.robot_inputs import WaitingQuestion
from oxygen_ros.core.text import clean_text
from oxygen_ros.core.tokenizer import Tokenizer, prompt_ids

S = 1_000_000_000
MS = 1_000_000


@pytest.fixture(scope="module")
def engine(lively_tiny):
    return Engine(lively_tiny, Tokenizer.default(), EngineConfig(max_observations_per_frame=1))


def make_loop(engine, clock=time.monotonic, **settings):
    engine.cancel_all()
    return FrameLoop(engine, LoopSettings(**settings), engine.model.config.max_token_len, horizon=10,
                     state_dim=4, log=logging.getLogger("test_frame_loop"), clock=clock)


def arrival(seq, stamp_s, received_s=None):
    received = stamp_s if received_s is None else received_s
    return Arrival(f"msg{seq}", seq, int(stamp_s * S), int(received * S), int(received * S))


def image_obs(instruction="pick up the cube", state=None):
    return Observation({"base": np.zeros((32, 32, 3), np.uint8)}, instruction, state)


def test_newest_observation_wins_and_older_ones_are_counted_superseded(engine):
    loop = make_loop(engine)
    assert loop.next_job(0, 0) is None and not loop.has_work()
    loop.observation_arrived(arrival(1, 10.0))
    loop.observation_arrived(arrival(2, 10.1))
    assert loop.has_work()
    job = loop.next_job(int(10.2 * S), 0)
    assert job.observation.seq == 2 and job.questions == []
    assert loop.counters["observations_received"] == 2 and loop.counters["observations_superseded"] == 1
    assert loop.next_job(int(10.2 * S), 0) is None


def test_stale_observation_is_not_used(engine):
    loop = make_loop(engine, max_observation_age=0.5)
    loop.observation_arrived(arrival(1, 10.0))
    assert loop.next_job(int(10.6 * S), 0) is None  # 0.6 s old when a frame would start
    assert loop.counters["observations_stale"] == 1
    loop.observation_arrived(arrival(2, 11.0))
    assert loop.next_job(int(11.4 * S), 0).observation.seq == 2
    loop.configure(max_observation_age=0.0)  # <= 0: no age check
    loop.observation_arrived(arrival(3, 1.0))
    assert loop.next_job(int(100 * S), 0).observation.seq == 3


def test_an_observation_already_old_on_arrival_names_the_clock_as_a_suspect(engine, caplog):
    """Stamped by a clock 3 s behind this node's, every observation reads as old: the warning
    says so, where one that grew old waiting here does not."""
    with caplog.at_level(logging.WARNING, logger="test_frame_loop"):
        loop = make_loop(engine, max_observation_age=0.5)
        loop.observation_arrived(arrival(1, 10.0, received_s=10.1))
        assert loop.next_job(int(10.7 * S), 0) is None  # it waited here
        loop = make_loop(engine, max_observation_age=0.5)  # a warning of one kind per 5 s: a loop of its own
        loop.observation_arrived(arrival(2, 17.0, received_s=20.0))
        assert loop.next_job(int(20.1 * S), 0) is None  # it came old
    waited, came_old = [r.getMessage() for r in caplog.records if "observation" in r.getMessage()]
    assert "is 0.700 s old" in waited and "clock" not in waited
    assert "is 3.100 s old" in came_old and "3.000 s old when it arrived" in came_old and "clock" in came_old


def test_language_cadence_counts_observation_frames(engine):
    loop = make_loop(engine, language_every_n_frames=3)
    starts = [loop.plan(True).start_language for _ in range(7)]
    assert starts == [True, False, False, True, False, False, True]
    assert loop.plan(False).start_language is False  # a language-only frame never starts one
    loop.configure(language_every_n_frames=0)
    assert not any(loop.plan(True).start_language for _ in range(3))


def _result(frame_id, action_ms, decode_ms, steps):
    return FrameResult(frame_id, [np.zeros((10, 2))], prefill_ms=action_ms / 2, denoise_ms=action_ms / 2,
                       decode_ms=decode_ms, batch_sizes=[1] * steps, total_ms=action_ms + decode_ms)


def test_k_shrinks_under_the_deadline_and_has_one_owner(engine):
    loop = make_loop(engine, steps_per_frame=5, frame_deadline_ms=100.0)
    plan = loop.plan(True)
    assert plan.decode_steps == 5
    loop.frame_ran(plan, _result(1, 95.0, 10.0, 5), True)  # the actions alone use the deadline
    assert loop.plan(True).decode_steps == 0
    assert loop.plan(False).decode_steps == 1  # language-only: at least one step
    loop.configure(decode_budget=False)
    assert loop.plan(True).decode_steps == 5
    loop.configure(steps_per_frame=2)
    assert loop.plan(True).decode_steps == 2 and loop.budget.k_max == 2
    assert list(loop.k_history) == [(1, 5, True)] and loop.last_k == 2  # frames that ran: (id, k, obs?)


def test_with_k_zero_language_only_frames_still_decode_one_step(engine):
    """steps_per_frame 0 (what oxygen-calibrate writes when no k meets the rate): observation
    frames decode nothing, language-only frames one step each, so requests still finish."""
    loop = make_loop(engine, steps_per_frame=0)
    assert loop.plan(True).decode_steps == 0
    assert loop.plan(False).decode_steps == 1
    engine.step([image_obs()], start_language=True, decode_steps=0)
    for _ in range(engine.config.max_decode + 1):
        if not engine.active_requests:
            break
        plan = loop.plan(False)
        engine.step([], start_language=False, decode_steps=plan.decode_steps)
    assert engine.active_requests == 0 and engine.pool.held == 0


def test_deadline_follows_rate_and_parameter(engine):
    loop = make_loop(engine, control_rate_hz=50.0)
    assert loop.deadline_ms() == pytest.approx(10 / 50 * 1e3 / 2)
    loop.configure(control_rate_hz=25.0)
    assert loop.budget.deadline_ms == pytest.approx(10 / 25 * 1e3 / 2) and loop.period_ns == 40 * MS
    loop.configure(frame_deadline_ms=150.0)
    assert loop.budget.deadline_ms == 150.0


def test_language_only_frame_when_requests_decode_and_no_observation_is_due(engine):
    loop = make_loop(engine)
    engine.step([image_obs()], start_language=True, decode_steps=0)  # a request now decodes
    assert loop.engine_has_work() and loop.has_work()
    assert loop.next_job(0, 30 * MS).observation is None  # a language-only job
    loop.frame_ended(30 * MS)
    assert loop.next_job(0, 40 * MS) is None  # at most one per control period (20 ms)
    for i in range(6):  # observations every 100 ms: the next one is due at 600 ms
        loop.observation_arrived(Arrival(None, i, 0, 0, i * 100 * MS))
        loop.next_job(0, i * 100 * MS)
    loop.frame_ended(500 * MS)
    loop.language_frame_ms.add(40.0)
    assert loop.observation_due_soon(560 * MS)  # would still run at 600 ms: actions first
    assert loop.next_job(0, 560 * MS) is None
    assert loop.next_job(0, 520 * MS) is not None
    loop.configure(decode_when_idle=False)
    assert loop.next_job(0, 530 * MS) is None
    engine.cancel_all()


def test_questions_are_cleaned_refused_when_empty_or_without_observation(engine):
    loop = make_loop(engine)
    engine.forget_observations()
    loop.question_arrived("a", "what\tis\x00 this?")
    loop.question_arrived("b", "\x01\n ")
    job = loop.next_job(0, 0)
    questions, refused = loop.questions(job, observed=())
    assert questions == [] and [q.client_id for q in refused] == ["a", "b"]  # in arrival order
    assert loop.counters["questions_rejected_empty"] == 1
    assert loop.counters["questions_rejected_no_observation"] == 1
    loop.question_arrived("a", "what\tis\x00 this?")
    questions, refused = loop.questions(loop.next_job(0, 0), observed=[""])
    assert [(q.client_id, q.text) for q in questions] == [("a", "what is this?")] and refused == []


def test_a_question_without_a_client_id_is_refused_saying_why(engine):
    """Its answer carried the empty client_id of the periodic descriptions, and an operator's UI
    showed it as one (a walkthrough of the language side)."""
    loop = make_loop(engine)
    loop.question_arrived("", "where is the target?")
    questions, refused = loop.questions(loop.next_job(0, 0), observed=[""])
    assert questions == [] and [q.refusal for q in refused] == [
        "no client_id: its answer would look like a periodic description (whose client_id is empty); give each "
        "question an id of its own"]
    assert loop.counters["questions_rejected_no_client_id"] == 1


def test_a_question_with_the_client_id_of_one_still_being_answered_is_warned_of_and_answered(engine, caplog):
    """A client that gives every question one id (a UI's name) gets two answers whose tokens it
    cannot tell apart by client_id: the log says so and counts it, and both are answered."""
    loop = make_loop(engine)
    loop.question_arrived("ui", "where is the target?")
    (first,), _ = loop.questions(loop.next_job(0, 0), observed=[""])
    result = engine.step([image_obs("look")], [first], start_language=False)
    (rid,) = {e.request_id for e in result.tokens if e.client_id == "ui"}
    assert not any(e.done for e in result.tokens if e.client_id == "ui"), "answered within one frame: no overlap"
    with caplog.at_level(logging.WARNING, logger="test_frame_loop"):
        loop.question_arrived("ui", "how many objects?")
        loop.question_arrived("other", "what colour is the target?")
        questions, refused = loop.questions(loop.next_job(0, 0), observed=[""])
    assert [q.client_id for q in questions] == ["ui", "other"] and refused == []
    warned = [r.getMessage() for r in caplog.records if "still to come" in r.getMessage()]
    assert warned == [f"question from 'ui' while the answer to an earlier one with that id is still to come "
                      f"(request {rid}): both answers' TextTokens carry that client_id, told apart only by "
                      "request_id; give each question an id of its own"], warned
    assert loop.counters["questions_same_client_id"] == 1  # on /diagnostics too: a monitor sees it
    engine.cancel_all()


def test_a_question_cut_by_its_characters_is_answered_with_the_note_that_it_was_cut(engine):
    """A question whose words fit the token limit but whose text runs past the characters the
    intake looks at (here after 4,000 spaces) loses its end there: its answer says it was cut,
    as one cut by its tokens does (the intake counted and logged the cut, the client heard nothing)."""
    limit = engine.config.max_question_tokens
    loop = make_loop(engine)
    loop.question_arrived("q", "where is the cup?" + " " * (limit * CHARS_PER_TOKEN) + "and the plate?")
    (question,), _ = loop.questions(loop.next_job(0, 0), observed=[""])
    assert question.cut and len(engine.tokenizer.encode(question.text)) < limit
    result = engine.step([image_obs("look")], [question], start_language=False)
    events = list(result.tokens)
    while engine.active_requests:
        events += engine.step().tokens
    (last,) = [e for e in events if e.client_id == "q" and e.done]
    assert last.detail == f"the question was cut to fit max_question_tokens ({limit})"
    assert loop.counters["questions_truncated"] == 1


def test_a_question_refused_for_want_of_an_observation_says_when_observations_came_but_were_refused(
        engine, caplog):
    """'No observation has arrived' would send the user looking for a dead camera, when the
    node refused every observation (7 joints for a 2-dimensional model, too many cameras)."""
    loop = make_loop(engine)
    engine.forget_observations()
    loop.robot("").count["observations_invalid"] += 3  # as the frame worker counts a refused message
    loop.question_arrived("q", "where is the target?")
    with caplog.at_level(logging.WARNING, logger="test_frame_loop"):
        assert loop.questions(loop.next_job(0, 0), observed=())[0] == []
    assert "no observation was usable yet (3 refused: the log says why)" in caplog.text
    assert "has arrived" not in caplog.text


def test_a_question_is_not_answered_from_an_observation_older_than_max_observation_age(engine, caplog):
    """A camera that stopped leaves the engine its robot's last observation: a question is
    refused (its client hears ``rejected``) rather than answered from that old image as if now."""
    loop = make_loop(engine, max_observation_age=1.0)
    engine.step([Observation({"base": np.zeros((32, 32, 3), np.uint8)}, "pick up the cube", None, stamp=10.0)],
                start_language=False)
    loop.question_arrived("late", "is the gripper at the target?")
    with caplog.at_level(logging.WARNING, logger="test_frame_loop"):
        questions, refused = loop.questions(loop.next_job(0, 0), observed=(), now_ros_ns=int(12.5 * S))
    assert questions == [] and [q.client_id for q in refused] == ["late"]
    assert refused[0].refusal.startswith("the newest observation is 2.5 s old")  # an Ask result carries it
    assert loop.counters["questions_rejected_stale"] == 1
    assert "newest observation is 2.5 s old (max_observation_age 1 s)" in caplog.text
    # answered: within max_observation_age, or with a fresh observation in this very frame
    loop.question_arrived("soon", "is the gripper at the target?")
    questions, _ = loop.questions(loop.next_job(0, 0), observed=(), now_ros_ns=int(10.9 * S))
    loop.question_arrived("with", "is the gripper at the target?")
    questions += loop.questions(loop.next_job(0, 0), observed=[""], now_ros_ns=int(12.5 * S))[0]
    loop.configure(max_observation_age=0.0)  # no age check
    loop.question_arrived("unchecked", "is the gripper at the target?")
    questions += loop.questions(loop.next_job(0, 0), observed=(), now_ros_ns=int(12.5 * S))[0]
    assert [q.client_id for q in questions] == ["soon", "with", "unchecked"]
    assert loop.counters["questions_rejected_stale"] == 1
    engine.forget_observations()


def test_a_question_asking_for_more_tokens_than_max_decode_is_refused_not_run(engine):
    """An Ask goal's max_tokens above the node's max_decode ends the question ``rejected``:
    it never reaches the engine, whose frame (and every other request in it) it would fail."""
    loop = make_loop(engine)
    n = engine.config.max_decode
    loop.question_arrived("over", "what is this?", max_tokens=n + 1)
    loop.question_arrived("at", "what is this?", max_tokens=n)
    questions, refused = loop.questions(loop.next_job(0, 0), observed=[""])
    assert [q.client_id for q in questions] == ["at"] and [q.client_id for q in refused] == ["over"]
    assert loop.counters["questions_rejected_max_tokens"] == 1
    res = engine.step([image_obs()], questions, start_language=False)  # the frame runs, the accepted one in it
    assert {e.client_id for e in res.tokens} == {"at"}
    engine.cancel_all()


def test_questions_put_back_and_taken_at_shutdown(engine):
    loop = make_loop(engine)
    loop.question_arrived("a", "one")
    loop.question_arrived("b", "two")
    job = loop.next_job(0, 0)
    loop.put_back(job)
    assert loop.take_questions() == [WaitingQuestion("a", "one", None), WaitingQuestion("b", "two", None)]
    assert not loop.take_questions()


def test_instruction_is_cut_to_fit_the_prompt_and_the_state_checked(engine):
    loop = make_loop(engine)
    max_len = engine.model.config.max_token_len
    obs = loop.fit_observation(image_obs("stack the red block " * 50, np.zeros(3, np.float32)), seq=1)
    assert len(prompt_ids(engine.tokenizer, obs.instruction, obs.state)) <= max_len
    assert 0 < len(obs.instruction) < 1000 and loop.counters["instructions_truncated"] == 1
    short = loop.fit_observation(image_obs("go\nleft"), seq=2)
    assert short.instruction == "go left" and loop.counters["instructions_truncated"] == 1
    with pytest.raises(ObservationError, match="state"):
        loop.fit_observation(image_obs("go", np.zeros(5, np.float32)), seq=3)  # stats cover 4


def test_the_instruction_is_cut_for_the_state_the_prompt_will_carry(lively_tiny):
    """The prompt carries the state normalised with the checkpoint's statistics: its bins, and
    so its length, are counted from that state, not the robot's raw one (here the raw zeros
    bin to 128 and the normalised state, under its 1st percentile, to -1: more tokens)."""
    from oxygen_ros.core.normalization import Normalizer

    stats = {"mean": [0.0] * 4, "std": [1.0] * 4, "q01": [1.0] * 4, "q99": [2.0] * 4}  # 0 -> -3
    engine = Engine(lively_tiny, Tokenizer.default(), EngineConfig(max_observations_per_frame=1),
                    normalizer=Normalizer(stats, stats, mode="quantile"))
    loop = make_loop(engine)
    max_len, raw, text = engine.model.config.max_token_len, np.zeros(4, np.float32), "stack the red block " * 50
    fitted = loop.fit_observation(image_obs(text, raw), seq=1)
    prompt_state = engine.prompt_state(raw)
    assert [round(float(v), 3) for v in prompt_state] == [-3.0] * 4
    assert len(prompt_ids(engine.tokenizer, fitted.instruction, prompt_state)) <= max_len
    as_raw = InstructionFitter(engine.tokenizer, max_len).fit(image_obs(text, raw)).observation.instruction
    assert len(fitted.instruction) < len(as_raw)  # the raw state's shorter bins would have let more in


def test_cameras_are_checked_as_the_engine_checks_them(lively_tiny):
    """An observation the engine would refuse (more cameras than max_cameras, a camera not in
    camera_names) is refused here, alone, before it could fail a frame with others in it."""
    engine = Engine(lively_tiny, Tokenizer.default(), EngineConfig(max_cameras=1, camera_names=("base",)))
    loop = make_loop(engine)
    image = np.zeros((32, 32, 3), np.uint8)
    with pytest.raises(ObservationError, match="2 cameras given, at most 1 .*max_cameras"):
        loop.fit_observation(Observation({"base": image, "wrist": image}, "go", None), seq=1)
    with pytest.raises(ObservationError, match=r"unknown camera\(s\) \['wrist'\]"):
        loop.fit_observation(Observation({"wrist": image}, "go", None), seq=2)
    assert loop.fit_observation(image_obs("go"), seq=3).images.keys() == {"base"}


def test_fitter_agrees_with_an_exhaustive_search_and_caches(engine):
    tok, max_len = engine.tokenizer, engine.model.config.max_token_len
    fitter = InstructionFitter(tok, max_len)
    text = "move the green cylinder to the left of the bowl " * 8
    fitted = fitter.fit(image_obs(text))
    best = max(n for n in range(len(text) + 1) if len(prompt_ids(tok, text[:n], None)) <= max_len)
    assert fitted.truncated and fitted.kept == best and fitted.observation.instruction == text[:best]
    assert fitter.fit(image_obs(text)).kept == best  # from the cache


def test_a_new_instruction_is_cut_for_its_own_text_not_the_one_before(engine):
    """A robot that changes its instruction gets the new one cut where it alone would be cut:
    the cut remembered for the instruction before (which also fits the new one, whose words
    take fewer tokens) is not reused, so no words of the new instruction are lost."""
    tok, max_len = engine.tokenizer, engine.model.config.max_token_len
    dense = "zq xv kj wq " * 60  # rare letters: many tokens per character, a short cut
    plain = "move the cup to the left " * 40  # common words: a longer cut
    fitter = InstructionFitter(tok, max_len)
    first = fitter.fit(image_obs(dense))
    fresh = InstructionFitter(tok, max_len).fit(image_obs(plain))
    assert first.truncated and fresh.truncated and fresh.kept > first.kept
    second = fitter.fit(image_obs(plain))
    assert second.kept == fresh.kept and second.observation.instruction == plain[:fresh.kept]


def test_a_cut_instruction_is_said_once_and_again_when_it_changes(engine, caplog):
    """The instruction comes with every observation: its cut is said once (the counter counts
    every observation), not every 5 s for as long as the robot works on it; a new one is said."""
    now = [0.0]
    loop = make_loop(engine, clock=lambda: now[0])
    long, other = "stack the red block " * 50, "put the green cup on the plate " * 50
    with caplog.at_level(logging.WARNING, logger="test_frame_loop"):
        for seq, text in enumerate([long] * 4 + [other] * 2 + [long]):
            loop.fit_observation(image_obs(text), seq=seq)
            now[0] += 6.0  # past the throttle's 5 s each time
    said = [r.getMessage() for r in caplog.records if "cut to" in r.getMessage()]
    assert [m.split(":")[0] for m in said] == ["observation 0", "observation 4", "observation 6"], said
    assert loop.counters["instructions_truncated"] == 7


def test_question_fit_and_text_cleaning(engine):
    tok = engine.tokenizer
    huge = "why " * (40 * CHARS_PER_TOKEN)
    fitted = fit_question(tok, huge, 32)
    assert fitted.truncated and len(fitted.text) <= 32 * CHARS_PER_TOKEN
    assert fit_question(tok, " \x00 ", 32).text == ""
    assert clean_text("a\tb\nc\x07d\ud800") == "a b cd?"
    assert clean_text("pick\x85the\u2028cup\u2029now") == "pick the cup now"  # every line break a space


def test_failures_stop_the_output_after_the_limit_and_resume(engine):
    loop = make_loop(engine, max_consecutive_failures=3)
    assert [loop.frame_failed("boom") for _ in range(4)] == [False, False, True, False]
    failures = loop.robot().failures
    assert failures.stopped and failures.in_a_row == 4 and failures.last == "boom"
    loop.frame_succeeded()
    assert not failures.stopped and failures.in_a_row == 0
    loop.configure(max_consecutive_failures=1)
    assert loop.frame_failed("again") is True


def test_a_plan_s_applies_to_its_frame_only(engine):
    obs = image_obs()
    assert engine.config.denoise_steps is None  # the checkpoint's (the model config's)
    default = engine.step([obs], start_language=False, decode_steps=0).actions[0]
    engine.frame_id -= 1  # the same noise for the next frame
    two = engine.step([obs], start_language=False, decode_steps=0, denoise_steps=2).actions[0]
    engine.frame_id -= 1
    again = engine.step([obs], start_language=False, decode_steps=0).actions[0]
    assert not np.allclose(default, two) and np.array_equal(default, again)
    assert engine.config.denoise_steps is None
    with pytest.raises(ValueError, match="denoise_steps"):
        engine.step([obs], denoise_steps=0)


def test_the_frame_loop_imports_without_rclpy():
    import subprocess
    import sys

    code = "import sys, oxygen_ros.core.frame_loop; print('rclpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_a_cancelled_question_ends_where_it_is(engine):
    """Still waiting: it ends in the loop (the caller announces it). Taken already: its
    request ends in the engine with the next job, which runs for that alone."""
    loop = make_loop(engine)
    loop.question_arrived("a", "one", 4)
    loop.question_arrived("b", "two")
    assert loop.cancel("a") is True
    job = loop.next_job(0, 0)
    assert job.questions == [WaitingQuestion("b", "two", None)] and job.cancels == []
    assert loop.cancel("b") is False
    assert loop.has_work()
    job = loop.next_job(0, 0)
    assert job.cancels == [("", "b")] and job.questions == [] and job.observation is None
    loop.put_back(job)
    assert loop.next_job(0, 0).cancels == [("", "b")]
    assert loop.counters["questions_cancelled"] == 2


def test_images_far_larger_than_the_model_takes_are_noted_once(engine, caplog):
    """The shipped model takes 32- or 48-pixel images; a camera node left at image_size 224
    sends 20x the bytes and costs a resize every frame: the loop says so once, naming the fix."""
    size = engine.model.config.vision.image_size
    loop = make_loop(engine)
    with caplog.at_level(logging.INFO, logger="test_frame_loop"):
        for seq in range(3):
            loop.fit_observation(Observation({"base": np.zeros((224, 224, 3), np.uint8)}, "pick it up"), seq)
        loop.fit_observation(image_obs(), 3)
    notes = [r.getMessage() for r in caplog.records if "image_size" in r.getMessage()]
    assert notes == [f"observations carry 224x224 images and the model takes {size}x{size}: each is resized every "
                     f"frame; the camera node's image_size: {size} sends them at the model's size"]
    quiet = make_loop(engine)
    with caplog.at_level(logging.INFO, logger="test_frame_loop"):
        caplog.clear()
        quiet.fit_observation(Observation({"base": np.zeros((size, size, 3), np.uint8)}, "pick it up"), 0)
    assert not [r for r in caplog.records if "image_size" in r.getMessage()]


def test_a_state_shorter_than_the_statistics_goes_in_padded_with_one_warning(engine, caplog):
    """A joint left out of state_joint_names gave the model a shorter state without a word
    (statistics padded past the robot's joints exist, so it is not refused)."""
    loop = make_loop(engine)
    with caplog.at_level(logging.WARNING, logger="test_frame_loop"):
        for seq in (1, 2, 3):
            loop.fit_observation(image_obs("go", np.zeros(3, np.float32)), seq=seq)
        loop.fit_observation(image_obs("go", np.zeros(4, np.float32)), seq=4)
    lines = [r.getMessage() for r in caplog.records if "zero-padded" in r.getMessage()]
    assert lines == ["observation 1: the state has 3 value(s), the checkpoint's state statistics cover 4: the model "
                     "gets it zero-padded. A joint missing from the camera node's state_joint_names (or its state "
                     "messages) makes every action wrong (said once)"]


def test_a_description_starts_only_with_a_slot_free_and_a_skipped_one_starts_at_the_next(lively_tiny):
    """Descriptions due every frame queued behind each other faster than they decoded: the queue
    filled and a client's question was refused ('queue full'), and they were decoded seconds after
    their image (a walkthrough of the language side). A due description with no slot free (or a
    request waiting for one) is skipped, counted, and the next frame with a slot free starts one."""
    engine = Engine(lively_tiny, Tokenizer.default(), EngineConfig(max_observations_per_frame=1, max_active=1,
                                                                   queue_limit=4))
    loop = make_loop(engine, language_every_n_frames=3)
    assert [loop.plan(True).start_language for _ in range(3)] == [True, False, False]
    engine.step([image_obs()], start_language=True, decode_steps=0)  # the slot is taken
    assert [loop.plan(True).start_language for _ in range(2)] == [False, False]  # due at the first, skipped
    assert loop.counters["descriptions_skipped"] == 1 and not engine.requests.queue
    assert not loop.plan(False).start_language  # a language-only frame starts none
    engine.cancel_all()
    assert loop.plan(True).start_language  # the one skipped, owed since
    assert [loop.plan(True).start_language for _ in range(4)] == [True, False, False, True]  # the cadence again
    assert loop.counters["descriptions_skipped"] == 1


def test_a_state_is_refused_when_the_statistics_have_no_state_entry(lively_tiny):
    """A LeRobot checkpoint copied with only its postprocessor's files (an openpi norm_stats.json
    without 'state' alike) has action statistics and none for the state: the state went into the
    prompt in the robot's units without a word (a walkthrough: 'State: 255 255 -1 255 ...'), and
    every action came from it. It is refused, saying what to give; without a state it runs."""
    from oxygen_ros.core.normalization import Normalizer

    stats = {"mean": [0.0] * 4, "std": [1.0] * 4, "q01": [-1.0] * 4, "q99": [1.0] * 4}
    engine = Engine(lively_tiny, Tokenizer.default(), EngineConfig(max_observations_per_frame=1),
                    normalizer=Normalizer(None, stats, mode="quantile"))
    loop = make_loop(engine)
    with pytest.raises(ObservationError, match=r"observation\.state: given, but the checkpoint's normalisation "
                       r"statistics have no state entry: .*norm_stats_path.*state_topic empty"):
        loop.fit_observation(image_obs("go", np.array([90.0, -45.0, 10.0, 0.0], np.float32)), seq=1)
    assert loop.fit_observation(image_obs("go"), seq=2).state is None
    assert loop.fit_observation(image_obs("go", np.zeros(0, np.float32)), seq=3).instruction == "go"


def test_no_state_for_a_checkpoint_trained_with_one_is_warned_once(engine, caplog):
    """The camera node's default state_topic is empty: a state-trained model then ran on zeros in
    place of the state without a word (the walkthrough's replay: 101 of 102 descriptions ' of
    gripper', against 'green triangle at gripper' with the state)."""
    loop = make_loop(engine)
    with caplog.at_level(logging.WARNING, logger="test_frame_loop"):
        for seq in (1, 2):
            loop.fit_observation(image_obs(), seq=seq)
        loop.fit_observation(image_obs("go", np.zeros(0, np.float32)), seq=3)
    lines = [r.getMessage() for r in caplog.records if "no robot state" in r.getMessage()]
    assert lines == ["observation 1: no robot state, and the checkpoint was trained with one (4 values, its "
                     "statistics): the model gets zeros in its place and its actions and text are likely wrong. "
                     "Set the camera node's state_topic (and state_joint_names) to the robot's joint states "
                     "(said once)"]
    caplog.clear()
    without = FrameLoop(engine, LoopSettings(), engine.model.config.max_token_len, horizon=10, state_dim=None,
                        log=logging.getLogger("test_frame_loop"))
    with caplog.at_level(logging.WARNING, logger="test_frame_loop"):
        without.fit_observation(image_obs(), seq=1)  # a checkpoint without state statistics: nothing to say
    assert not [r for r in caplog.records if "no robot state" in r.getMessage()]

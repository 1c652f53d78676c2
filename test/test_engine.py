"""The engine under the four settings: same tokens, same actions, admission, independence."""

import contextlib

import numpy as np
import pytest
from engine_harness import run_to_the_end, scene_observations

from oxygen_ros.core.engine import Engine, EngineConfig, Question
from oxygen_ros.core.observation import Observation
from oxygen_ros.core.workloads import Workload

SETTINGS = ("baseline", "parallel", "shared_kv", "oxygen")


@pytest.fixture(scope="module")
def model(lively_tiny):
    return lively_tiny


def run(model, tok, setting, schedule, agents=1, **cfg):
    """Feed ``agents`` observations per frame and the scheduled requests (as
    questions with empty text, one per arrival) and collect everything."""
    config = EngineConfig(setting=setting, language_every_n_frames=0, **cfg)
    engine = Engine(model, tok, config)
    obs = scene_observations(len(schedule) * agents, seed=11)
    finished, actions, events = [], [], []
    for f, lengths in enumerate(schedule):
        qs = [Question("", client_id=f"f{f}q{j}", max_tokens=n) for j, n in enumerate(lengths)]
        res = engine.step(obs[f * agents : (f + 1) * agents], qs)
        finished += res.finished
        actions += res.actions
        events += res.tokens
    run_to_the_end(engine, [], events, finished)
    assert engine.pool.held == 0, "every slot is free once all requests are done"
    return {r.client_id: (r.tokens, r.finish_reason.value) for r in finished}, np.stack(actions), events, engine


@pytest.mark.parametrize("spec, agents", [("uniform:1", 1), ("poisson:1.5", 1), ("random-length:2-14", 2)])
def test_every_setting_gives_the_same_tokens_and_actions(model, tok, spec, agents):
    schedule = Workload.parse(spec).schedule(frames=8, max_tokens=14, seed=5)
    assert sum(map(len, schedule)) >= 8
    results = {s: run(model, tok, s, schedule, agents=agents, max_decode=14, steps_per_frame=3, max_active=6,
                      queue_limit=32) for s in SETTINGS}
    ref_tokens, ref_actions, _, _ = results["baseline"]
    assert len(ref_tokens) == sum(map(len, schedule))
    assert all(reason in ("eos", "length") for _, reason in ref_tokens.values())
    assert len({tuple(t) for t, _ in ref_tokens.values()}) >= 3  # texts differ between observations
    for setting, (tokens, actions, _, _) in results.items():
        assert tokens == ref_tokens, setting
        np.testing.assert_allclose(actions, ref_actions, atol=1e-5, err_msg=setting)


def test_tokens_stream_in_order_and_end_with_done(model, tok):
    schedule = [[6], [6, 6], [], [6]]
    tokens, _, events, _ = run(model, tok, "oxygen", schedule, max_decode=6, steps_per_frame=2)
    per_request = {}
    for e in events:
        per_request.setdefault(e.client_id, []).append(e)
    for cid, evs in per_request.items():
        assert [e.index for e in evs] == list(range(len(evs)))
        assert [e.token_id for e in evs] == tokens[cid][0]
        assert evs[-1].done and evs[-1].finish_reason in ("eos", "length")
        assert not any(e.done for e in evs[:-1])


def test_oxygen_keeps_requests_across_frames_with_k_tokens_each(model, tok):
    _, _, _, engine = run(model, tok, "oxygen", [[]], max_decode=10, steps_per_frame=3)
    obs = scene_observations(4)
    res = engine.step([obs[0]], [Question("", "a")])
    assert len(res.tokens) == 1 + 3  # first token from the prefill, then k decode steps
    res = engine.step([obs[1]], [Question("", "b")])
    assert res.batch_sizes == [2, 2, 2]  # both requests advance together
    assert engine.active_requests == 2


def test_full_pool_queues_then_rejects_and_still_acts(model, tok):
    engine = Engine(model, tok, EngineConfig(setting="oxygen", max_decode=4, steps_per_frame=1, max_active=2,
                                             queue_limit=1, language_every_n_frames=0))
    obs = scene_observations(6)
    res = engine.step([obs[0]], [Question("", f"q{i}") for i in range(4)])
    assert len(res.actions) == 1 and np.isfinite(res.actions[0]).all()
    assert sorted(res.started) == [1, 2] and engine.queued_requests == 1
    rejected = [e for e in res.tokens if e.finish_reason == "rejected"]
    assert [e.client_id for e in rejected] == ["q3"] and rejected[0].done and rejected[0].token_id == -1
    assert rejected[0].detail == "the queue of waiting requests is full (queue_limit 1)"  # an Ask result says it
    finished = list(res.finished)
    for o in obs[1:5]:
        r = engine.step([o])
        assert len(r.actions) == 1
        finished += r.finished
    finished += engine.drain()
    by_id = {r.client_id: r for r in finished}
    assert by_id["q2"].finish_reason.value in ("eos", "length")  # the queued one ran in full
    assert all(len(by_id[c].tokens) == 4 or by_id[c].tokens[-1] == tok.eos_id for c in ("q0", "q1", "q2"))


def test_finishing_or_cancelling_one_request_leaves_the_others_unchanged(model, tok):
    alone = {}
    for cid, n in (("long", 12), ("other", 12)):
        tokens, _, _, _ = run(model, tok, "oxygen", [[n]], max_decode=12, steps_per_frame=2)
        alone[cid] = next(iter(tokens.values()))[0]
    engine = Engine(model, tok, EngineConfig(setting="oxygen", max_decode=12, steps_per_frame=2,
                                             language_every_n_frames=0))
    obs = scene_observations(30, seed=11)
    engine.step([obs[0]], [Question("", "long"), Question("", "short", max_tokens=3), Question("", "victim")])
    engine.step([obs[1]])
    victim = next(r for r in engine.requests.active.values() if r.client_id == "victim")
    engine.requests.remove(victim.id)  # cancelled mid-batch
    finished = engine.drain()
    got = {r.client_id: r.tokens for r in finished}
    assert got["long"] == alone["long"][: len(got["long"])] and len(got["long"]) == len(alone["long"])


def test_question_is_appended_after_the_shared_prefix(model, tok):
    engine = Engine(model, tok, EngineConfig(setting="oxygen", max_decode=6, steps_per_frame=6,
                                             language_every_n_frames=1))
    calls = []
    original = model.prefill

    def counting_prefill(batch, cache, slots):
        calls.append([list(s) for s in slots])
        return original(batch, cache, slots)

    model.prefill = counting_prefill
    try:
        obs = scene_observations(1)[0]
        res = engine.step([obs], [Question("what do you see", "asker")])
    finally:
        del model.prefill
    assert len(calls) == 1 and len(calls[0]) == 1 and len(calls[0][0]) == 2  # one row, two slots
    answers = {r.client_id: r.tokens for r in res.finished}
    plain = answers[""]
    asked = answers["asker"]
    assert plain != asked  # the question reached the model
    # the same question asked alone gives the same answer
    engine2 = Engine(model, tok, EngineConfig(setting="baseline", max_decode=6, language_every_n_frames=0))
    res2 = engine2.step([obs], [Question("what do you see", "asker")])
    assert res2.finished[0].tokens == asked


def test_bad_configuration_is_refused():
    with pytest.raises(ValueError, match="setting"):
        EngineConfig(setting="fast")
    with pytest.raises(ValueError, match="steps_per_frame"):
        EngineConfig(max_decode=4, steps_per_frame=5)
    with pytest.raises(ValueError, match="max_question_tokens must be >= 1"):  # 0 would make every question empty
        EngineConfig(max_question_tokens=0)
    with pytest.raises(ValueError, match="bad arrivals"):
        Workload.parse("burst:3")


def test_a_uniform_workload_spreads_a_fractional_rate_over_the_frames():
    """``--arrivals uniform:R`` brings R requests a frame on average, evenly: 0.5 a request
    every other frame, 1.5 one and two in turn (not R rounded to a whole number every frame)."""
    assert Workload.parse("uniform:0.5").schedule(frames=6, max_tokens=7) == [[], [7], [], [7], [], [7]]
    assert [len(f) for f in Workload.parse("uniform:1.5").schedule(frames=6, max_tokens=7)] == [1, 2, 1, 2, 1, 2]
    assert [len(f) for f in Workload.parse("uniform:0.25").schedule(frames=8, max_tokens=7)] == [0, 0, 0, 1] * 2


@contextlib.contextmanager
def _failing(model, method: str, message: str):
    """``model.<method>`` raises RuntimeError(message) inside the block (the model's own after)."""
    setattr(model, method, lambda *a, **kw: (_ for _ in ()).throw(RuntimeError(message)))
    try:
        yield
    finally:
        delattr(model, method)


@pytest.mark.parametrize("setting", SETTINGS)
def test_a_failed_frame_loses_nothing_and_the_next_one_runs(model, tok, setting):
    from oxygen_ros.core.engine import FrameError

    engine = Engine(model, tok, EngineConfig(setting=setting, max_decode=6, steps_per_frame=2,
                                             language_every_n_frames=0))
    obs = scene_observations(5)
    first = engine.step([obs[0]], [Question("", "early")])
    original = model.denoise
    with _failing(model, "denoise", "device lost"), pytest.raises(FrameError, match="device lost") as err:
        engine.step([obs[1]], [Question("", "during")])
    assert model.denoise == original
    assert all(engine.pool.owner(s) != "scratch" for s in range(engine.pool.capacity))
    events = first.tokens + err.value.result.tokens
    finished = list(first.finished) + list(err.value.result.finished)
    run_to_the_end(engine, obs[2:], events, finished)
    by_client = {r.client_id: r for r in finished}
    assert set(by_client) == {"early", "during"}  # the request of the failed frame still ran
    for cid, r in by_client.items():
        streamed = [e.token_id for e in events if e.client_id == cid]
        assert streamed == r.tokens and r.finish_reason.value in ("eos", "length")


@pytest.mark.parametrize("setting", SETTINGS)
def test_a_frame_that_fails_on_a_question_s_tokens_leaves_it_waiting_and_the_engine_running(model, tok, setting):
    """The question's tokens are appended to its slot before the request is stored: a failure
    there (out of memory...) fails that frame only; the question starts again in the next."""
    from oxygen_ros.core.engine import FrameError

    engine = Engine(model, tok, EngineConfig(setting=setting, max_decode=6, steps_per_frame=2,
                                             language_every_n_frames=0))
    obs = scene_observations(5)
    engine.step([obs[0]])
    with _failing(model, "extend", "out of memory"), pytest.raises(FrameError, match="out of memory") as err:
        engine.step([obs[1]], [Question("where is the cube?", "q")])
    assert engine.active_requests == 0 and all(engine.pool.owner(s) is None for s in range(engine.pool.capacity))
    events, finished = list(err.value.result.tokens), list(err.value.result.finished)
    run_to_the_end(engine, obs[2:], events, finished)
    assert [r.client_id for r in finished] == ["q"] and finished[0].finish_reason.value in ("eos", "length")
    assert [e.token_id for e in events if e.client_id == "q"] == finished[0].tokens


def test_a_bad_question_is_refused_before_the_frame_changes_anything(model, tok):
    engine = Engine(model, tok, EngineConfig(max_decode=6, language_every_n_frames=0))
    obs = scene_observations(2)
    with pytest.raises(ValueError, match="none from the robot has arrived yet"):
        engine.step([], [Question("where?", "early")])
    with pytest.raises(ValueError, match="none from robot 'left'"):
        engine.step([obs[0]], [Question("where?", "other", robot="left")])
    with pytest.raises(ValueError, match=r"max_tokens must be in 1..6 \(max_decode\), got 7"):
        engine.step([obs[0]], [Question("where?", "long", max_tokens=7)])
    with pytest.raises(ValueError, match="decode_steps must be >= 0, got -3"):
        engine.step([obs[0]], decode_steps=-3)
    assert engine.frame_id == 0 and not engine.last_observations and engine.queued_requests == 0
    res = engine.step([obs[1]], [Question("where?", "ok", max_tokens=6)])  # a question on this frame's observation
    assert res.frame_id == 1 and len(res.actions) == 1 and {e.client_id for e in res.tokens} == {"ok"}
    engine.cancel_all()
    later = engine.step([], [Question("where?", "later", max_tokens=6)])  # frame 2 answers from frame 1's observation
    assert later.frame_id == 2 and {e.frame_id for e in later.tokens} == {1}
    engine.cancel_all()


@pytest.mark.parametrize("setting", SETTINGS)
def test_more_questions_in_one_frame_than_the_pool_has_slots_are_all_answered(model, tok, setting):
    """Three slots (max_active 2 + one observation) and five questions at once: the isolated
    settings take one slot at a time for them, the batched ones queue what does not fit."""
    engine = Engine(model, tok, EngineConfig(setting=setting, max_active=2, max_observations_per_frame=1,
                                             max_decode=4, steps_per_frame=2, language_every_n_frames=0))
    assert engine.pool.capacity == 3
    obs = scene_observations(6)
    engine.step([obs[0]])
    questions = [Question("where is the cube?", f"q{i}") for i in range(5)]
    first = engine.step([obs[1]], questions)
    assert len(first.actions) == 1
    events, finished = list(first.tokens), list(first.finished)
    run_to_the_end(engine, obs[2:], events, finished)
    assert sorted(r.client_id for r in finished) == [f"q{i}" for i in range(5)]
    assert all(r.finish_reason.value in ("eos", "length") for r in finished)


def test_the_state_is_normalised_with_the_checkpoint_statistics_before_binning(model, tok):
    from oxygen_ros.core.normalization import Normalizer
    from oxygen_ros.core.tokenizer import discretize_state

    stats = {"mean": [10.0, 20.0], "std": [5.0, 5.0], "q01": [0.0, 0.0], "q99": [20.0, 40.0]}
    act = {"mean": [0.0] * 2, "std": [1.0] * 2, "q01": [-1.0] * 2, "q99": [1.0] * 2}
    norm = Normalizer(stats, act, mode="quantile")
    base = scene_observations(1)[0]
    robot = Observation(base.images, base.instruction, np.array([10.0, 30.0], np.float32))
    normalised = norm.normalize_state(robot.state).astype(np.float32)  # about [0, 0.5]
    np.testing.assert_allclose(normalised, [0.0, 0.5], atol=1e-5)
    assert list(discretize_state(robot.state)) == [255, 255]  # unnormalised it would saturate
    model_units = Observation(base.images, base.instruction, normalised)
    config = EngineConfig(setting="oxygen", max_decode=8, steps_per_frame=8)
    with_stats = Engine(model, tok, config, normalizer=norm).step([robot])
    plain = Engine(model, tok, config).step([model_units])
    raw = Engine(model, tok, config).step([robot])
    assert with_stats.finished[0].tokens == plain.finished[0].tokens
    assert with_stats.finished[0].tokens != raw.finished[0].tokens


def test_a_tokenizer_smaller_than_the_vocabulary_masks_the_ids_it_cannot_decode(tok, caplog):
    import dataclasses
    import logging

    import torch

    from oxygen_ros.core.model.config import TINY
    from oxygen_ros.core.model.vla import build_model

    big = build_model(dataclasses.replace(TINY, vocab_size=tok.vocab_size + 64), seed=3)
    with torch.no_grad():  # ids past the tokenizer win every greedy choice unless masked
        big.language_model.embed_tokens.weight[tok.vocab_size:] *= 50.0
    with caplog.at_level(logging.WARNING, logger="oxygen_ros.core.engine"):
        engine = Engine(big, tok, EngineConfig(max_decode=8, steps_per_frame=8, language_every_n_frames=0))
    assert f"tokenizer has {tok.vocab_size} tokens, the model's vocabulary {tok.vocab_size + 64}" in caplog.text
    res = engine.step(scene_observations(1), [Question("where is the target?", "q")])
    assert res.finished and res.finished[0].finish_reason.value in ("eos", "length")
    assert all(0 <= t < tok.vocab_size for t in res.finished[0].tokens)


def test_a_tokenizer_larger_than_the_vocabulary_is_refused_naming_both_sizes(tok):
    import dataclasses

    from oxygen_ros.core.model.config import TINY
    from oxygen_ros.core.model.vla import build_model

    small = build_model(dataclasses.replace(TINY, vocab_size=tok.vocab_size - 12), seed=3)
    with pytest.raises(ValueError, match=f"tokenizer has {tok.vocab_size} tokens, the model's vocabulary only "
                                         f"{tok.vocab_size - 12}"):
        Engine(small, tok, EngineConfig())


def test_engine_takes_a_10000_character_instruction_and_question(tok):
    """An over-long prompt is cut with a warning, an over-long question to
    max_question_tokens; the frame and the request run normally, and the answer's last
    token says the question was cut (what a client reads in TextToken.reason)."""
    from oxygen_ros.core.model.config import TINY
    from oxygen_ros.core.model.vla import build_model

    engine = Engine(build_model(TINY, seed=0), tok, EngineConfig(max_decode=4, steps_per_frame=4))
    image = np.zeros((16, 16, 3), np.uint8)
    instruction = ("stack the cubes " * 700)[:10_000]
    with pytest.warns(UserWarning, match="truncating"):
        result = engine.step([Observation({"base": image}, instruction, np.array([0.1, 0.2], np.float32))],
                             [Question(("why " * 2500)[:10_000], client_id="q")])
    assert np.all(np.isfinite(result.actions[0]))
    assert len(result.started) == 2
    events, finished = list(result.tokens), list(result.finished)
    run_to_the_end(engine, [], events, finished)
    question = [r for r in finished if r.client_id == "q"]
    assert len(question) == 1 and question[0].finish_reason.value in ("eos", "length")
    assert len(question[0].question_ids) == engine.config.max_question_tokens
    notes = {e.client_id: e.detail for e in events if e.done}
    assert notes == {"q": "the question was cut to fit max_question_tokens (32)", "": ""}
    assert all(e.detail == "" for e in events if not e.done)


def test_a_question_within_max_question_tokens_ends_with_no_note(model, tok):
    engine = Engine(model, tok, EngineConfig(max_decode=4, steps_per_frame=4, language_every_n_frames=0))
    result = engine.step(scene_observations(1, seed=3), [Question("what is on the table?", client_id="q")])
    events, finished = list(result.tokens), list(result.finished)
    run_to_the_end(engine, [], events, finished)
    assert [(e.client_id, e.detail) for e in events if e.done] == [("q", "")]


def test_a_pool_slot_holds_the_served_cameras_only_and_the_longest_request_fits(tok):
    """The pool sizes its slots for the cameras the engine serves (``max_cameras``), not for every
    camera slot of the model: less memory, and nothing read past the longest prefix; the longest
    prompt, the longest question and a full answer still fit."""
    from oxygen_ros.core.model.config import TINY
    from oxygen_ros.core.model.vla import build_model

    model = build_model(TINY, seed=0)
    assert TINY.max_cameras == 3
    every = Engine(model, tok, EngineConfig(max_decode=12, steps_per_frame=4))
    one = Engine(model, tok, EngineConfig(max_decode=12, steps_per_frame=4, max_cameras=1))
    per_image = TINY.vision.tokens_per_image
    assert every.pool.cache.max_len - one.pool.cache.max_len == 2 * per_image
    assert one.pool.bytes_reserved < every.pool.bytes_reserved
    image = np.zeros((16, 16, 3), np.uint8)
    with pytest.warns(UserWarning, match="truncating"):
        result = one.step([Observation({"base": image}, "stack the cubes " * 50, np.array([0.1, 0.2], np.float32))],
                          [Question("why " * 100, client_id="q", max_tokens=12)])
    assert np.all(np.isfinite(result.actions[0]))
    question = [r for r in result.finished + one.drain() if r.client_id == "q"][0]
    assert len(question.question_ids) == one.config.max_question_tokens
    assert len(question.tokens) == 12 or question.finish_reason.value == "eos"
    with pytest.raises(ValueError, match="max_cameras"):
        one.step([Observation({"base": image, "wrist": image}, "go", None)])


def test_without_noise_seeds_the_observations_of_one_frame_get_different_noise(model, tok):
    """Two robots sending the same observation in one frame are two draws, not one: without
    ``noise_seeds`` each observation's noise is seeded by its position too, so their chunks differ
    (the same position in another engine with the same seed gives the same chunk again)."""
    config = EngineConfig(setting="oxygen", max_decode=4, steps_per_frame=4)
    obs = scene_observations(1, seed=3)[0]
    twice = Engine(model, tok, config).step([obs, obs]).actions
    assert len(twice) == 2 and np.isfinite(twice[0]).all()
    assert not np.allclose(twice[0], twice[1]), "the same noise for both observations of the frame"
    again = Engine(model, tok, config).step([obs, obs]).actions
    np.testing.assert_allclose(again[1], twice[1], atol=1e-5)  # seeded, not random

"""The inference node's inputs: whatever arrives on its Observation and Question topics,
it keeps running, counts what was wrong and never feeds bad data to the model
(invalid observations refused, instructions and questions cleaned and cut to fit).

Real nodes on real DDS (private contexts, topics of their own); counts and message
contents are checked, never durations.
"""

import array
import functools
import json
import math

import numpy as np
import ros_harness
from message_builders import INVALID_UTF8, cdr_with, observation_msg
from ros_harness import InferenceClient, inference_node, unique_prefix

until = functools.partial(ros_harness.until, timeout=20.0)


def _record_engine_inputs(node):
    """Wrap Engine.step: every observation and question the model is given."""
    seen = []
    step = node.engine.step

    def recording(observations=(), questions=(), **kw):
        seen.extend(observations)
        seen.extend(questions)
        return step(observations, questions, **kw)

    node.engine.step = recording
    return seen


def test_inference_node_refuses_bad_observations_and_cuts_long_instructions(ros, tmp_path):
    from oxygen_ros.core.tokenizer import prompt_ids
    from oxygen_ros.ros.conversions import ns_to_time_msg

    stats = {"norm_stats": {"state": {"mean": [0, 0], "std": [1, 1], "q01": [-1, -1], "q99": [1, 1]},
                            "actions": {"mean": [0] * 4, "std": [1] * 4, "q01": [-1] * 4, "q99": [1] * 4}}}
    (tmp_path / "norm_stats.json").write_text(json.dumps(stats))
    prefix = unique_prefix()
    node = inference_node(ros, prefix, norm_stats_path=str(tmp_path / "norm_stats.json"), chunk_origin="frame_end",
                          language_every_n_frames=0, frame_deadline_ms=5000.0, max_cameras=1)
    seen = _record_engine_inputs(node)
    client = InferenceClient(ros, prefix, "oxygen_test_reliability_client", node=node)
    client.observe()
    assert until(lambda: node.counters["frames"] >= 1)

    def with_state(values):
        m = observation_msg(client.seq, client.now())
        m.state = array.array("f", values)
        return m

    def names_mismatch():
        m = observation_msg(client.seq, client.now())
        m.camera_names = ["base", "wrist"]
        return m

    def two_cameras():  # the model has 3 camera slots, the node takes 1 (max_cameras)
        m = observation_msg(client.seq, client.now())
        m.images.append(m.images[0])
        m.camera_names = ["base", "wrist"]
        return m

    def bad_image():
        m = observation_msg(client.seq, client.now())
        m.images[0].step = 5
        return m

    bad = [with_state([0.1, math.nan]), with_state([math.inf, 0.0]), names_mismatch(), two_cameras(), bad_image(),
           with_state([0.0] * 40),  # more than MAX_STATE_DIM
           with_state([0.1, 0.2, 0.3])]  # wider than the checkpoint's state statistics
    for msg in bad:
        before = node.counters["observations_invalid"]
        msg.header.stamp = ns_to_time_msg(client.now())
        client.obs.publish(msg)
        assert until(lambda: node.counters["observations_invalid"] > before)
    frames = node.counters["frames"]
    long_instruction = "please pick up the small red cube next to the plate " * 200  # 10,600 characters
    client.observe(instruction=long_instruction)
    assert until(lambda: node.counters["frames"] > frames)
    client.observe(instruction="ok\x07 then")
    assert until(lambda: node.counters["frames"] > frames + 1)
    assert node.counters["observations_invalid"] == len(bad)
    assert node.counters["instructions_truncated"] == 1
    assert node.counters["frame_errors"] == 0  # each refused alone, before any frame

    observations = [o for o in seen if hasattr(o, "images")]
    assert observations and all(o.state is None or (np.all(np.isfinite(o.state)) and o.state.shape[0] <= 2)
                                for o in observations), "a bad state reached the model"
    cut = [o for o in observations if o.instruction.startswith("please pick")]
    assert len(cut) == 1 and 0 < len(cut[0].instruction) < len(long_instruction)
    max_len = node.loaded.config.max_token_len
    assert len(prompt_ids(node.engine.tokenizer, cut[0].instruction, cut[0].state)) <= max_len
    assert observations[-1].instruction == "ok then"
    assert node.diagnostics()["observations_invalid"] == len(bad)


def test_a_bad_observation_never_takes_the_place_of_a_good_one(ros):
    """Observations are checked as they arrive: a bad one right behind a good one, while a
    frame runs, is refused and counted, and the good one makes the next frame (it used to
    be replaced while it waited for the worker, and was lost)."""
    from oxygen_ros.ros.conversions import ns_to_time_msg

    prefix = unique_prefix()
    node = inference_node(ros, prefix, language_every_n_frames=0, denoise_steps=300,  # long frames
                          chunk_origin="frame_end", max_observation_age=0.0)
    client = InferenceClient(ros, prefix, "oxygen_test_burst_client", node=node)
    waiting = []
    for _ in range(5):
        frames = node.counters["frames"]
        client.observe()  # a frame starts from this one
        assert until(lambda: node.worker.busy or node.counters["frames"] > frames)
        waiting.append(client.seq)
        received = node.counters["observations_received"]
        client.observe()  # this one waits for the frame to end ...
        # (the node's reader keeps the newest message only: it takes this one before the next is sent)
        assert until(lambda: node.counters["observations_received"] > received)
        bad = observation_msg(client.seq, client.now())  # ... and this one comes right behind it
        bad.camera_names = ["base", "wrist"]
        bad.header.stamp = ns_to_time_msg(client.now())
        client.obs.publish(bad)
        client.seq += 1
        assert until(lambda: any(c.observation_seq >= waiting[-1] for c in client.chunks)
                     and not node.worker.busy), (waiting, sorted({c.observation_seq for c in client.chunks}),
                                                 dict(node.counters), node.tick_counts())
    assert until(lambda: node.counters["observations_invalid"] == 5), node.counters["observations_invalid"]
    used = {c.observation_seq for c in client.chunks}
    assert set(waiting) <= used, f"good observations lost behind bad ones: {sorted(set(waiting) - used)}"


def test_inference_node_questions_empty_huge_control_and_invalid_utf8(ros):
    prefix = unique_prefix()
    node = inference_node(ros, prefix, language_every_n_frames=0, max_decode=8, steps_per_frame=4,
                          frame_deadline_ms=5000.0)
    seen = _record_engine_inputs(node)
    client = InferenceClient(ros, prefix, "oxygen_test_reliability_client", node=node)
    for _ in range(3):
        client.observe()
    assert until(lambda: node.counters["frames"] >= 1)

    for name, text in [("empty", ""), ("blank", "   \t "), ("control", "\x07\x1b\x01")]:
        client.ask(name, text)
    client.ask("huge", "what is on the table and where should it go? " * 230)  # 10,350 characters
    client.ask("bell", "what\x07 do you\tsee?")
    client.q.publish(cdr_with(client.Question(client_id="utf8", text="is ABCD there?"), b"ABCD", INVALID_UTF8))
    clients = ["empty", "blank", "control", "huge", "bell", "utf8"]

    def all_done():
        client.observe()
        return all(client.finished(c) for c in clients)

    assert until(all_done, timeout=30.0, period=0.1), {c: client.finished(c) for c in clients}
    for c in ("empty", "blank", "control"):
        (m,) = client.finished(c)
        assert m.finish_reason == "rejected" and m.token_id == -1 and m.reason == "no text", (c, m.reason)
    for c in ("huge", "bell", "utf8"):
        (m,) = client.finished(c)
        assert m.finish_reason in ("eos", "length"), (c, m.finish_reason)
        # the client of a cut question learns it from the answer's last message
        assert m.reason == ("the question was cut to fit max_question_tokens (32)"
                            if c == "huge" else ""), (c, m.reason)
        tokens = [t for t in client.text if t.client_id == c]
        assert [t.index for t in tokens] == list(range(len(tokens))), "a token was lost"
    assert node.counters["questions_rejected_empty"] == 3
    assert node.counters["questions_truncated"] == 1
    questions = {q.client_id: q for q in seen if hasattr(q, "client_id") and not hasattr(q, "images")}
    assert set(questions) == {"huge", "bell", "utf8"}
    assert questions["bell"].text == "what do you see?"
    assert "\ufffd" in questions["utf8"].text
    assert len(questions["huge"].text) <= node.engine.config.max_question_tokens * 100


def test_observations_that_came_before_the_node_could_take_them_give_one_frame_the_newest(stepped_ros):
    """Observations that reached the node while its executor took nothing (at its start, before
    it spins) do not come to it oldest first: the newest makes the first frame and the older
    ones none. Each would have cost a frame, on a chunk whose actions were already in the past
    when it came out (start-up underruns with four robots)."""
    import time

    from oxygen_ros.msg import Observation

    prefix = unique_prefix()
    node = inference_node(stepped_ros, prefix, language_every_n_frames=0, warmup_frames=0, control_process=False)
    camera = stepped_ros.node("oxygen_test_backlog_camera")
    pub = camera.create_publisher(Observation, ros_harness.inference_topics(prefix)["observation_topic"],
                                  ros_harness.reliable(10))
    assert stepped_ros.spin_until(lambda: pub.get_subscription_count() >= 1)
    for seq in range(3):
        pub.publish(observation_msg(seq, camera.get_clock().now().nanoseconds))
    time.sleep(0.5)  # in the node's reader; nothing spins, so nothing is taken yet
    assert stepped_ros.spin_until(lambda: node.counters["frames"] >= 1, timeout=20.0)
    stepped_ros.spin_for(0.5)
    assert node.counters["observations_received"] == 1, dict(node.counters)
    assert [r.observation_seq for r in node.frame_records().values()] == [2]


def test_an_observation_stamped_before_its_whole_chunk_is_counted_and_said_when_it_loses_its_origin(ros):
    """A camera whose stamps lag more than a chunk covers (H x P) leaves no row of the chunk in the
    future: the chunk starts at the frame's end, as before, but now counted and told on
    /diagnostics, since its actions are then not delay-compensated (a camera's latency, a clock)."""
    prefix = unique_prefix()
    node = inference_node(ros, prefix, language_every_n_frames=0, frame_deadline_ms=5000.0, max_cameras=1)
    client = InferenceClient(ros, prefix, "oxygen_test_origin_client", node=node)
    client.observe()
    assert until(lambda: node.counters["frames"] >= 1)
    assert node.counters["chunks_from_frame_end"] == 0  # a fresh stamp is the origin
    chunk_s = node.horizon / node.params["control_rate_hz"]
    frames = node.counters["frames"]
    client.observe(age_s=chunk_s + 0.3)
    assert until(lambda: node.counters["frames"] > frames)
    assert node.counters["chunks_from_frame_end"] == 1
    assert until(lambda: any("chunks started at the frame's end" in s.message for s in client.diagnostics))
    status = next(s for s in client.diagnostics if "chunks started at the frame's end" in s.message)
    assert {v.key: v.value for v in status.values}["chunks_from_frame_end"] == "1"


def test_a_first_observation_older_than_its_chunk_is_told_calmly_the_next_ones_warned(ros, capfd):
    """A camera node holds its first group while its inputs come up: at every start of a real arm the
    first observation arrived 240-330 ms after its stamp, past its chunk, and a WARN said so."""
    prefix = unique_prefix()
    node = inference_node(ros, prefix, language_every_n_frames=0, frame_deadline_ms=5000.0, max_cameras=1)
    client = InferenceClient(ros, prefix, "oxygen_test_first_client", node=node)
    chunk_s = node.horizon / node.params["control_rate_hz"]
    client.observe(age_s=chunk_s + 0.3)
    assert until(lambda: node.counters["frames"] >= 1)
    client.observe(age_s=chunk_s + 0.3)
    assert until(lambda: node.counters["frames"] >= 2)
    assert node.counters["chunks_from_frame_end"] == 2
    lines = [line for line in capfd.readouterr().err.splitlines() if "its chunk starts at the frame's end" in line]
    assert len(lines) == 2 and lines[0].startswith("[INFO]") and lines[1].startswith("[WARN]"), lines
    assert "(the first: held while the camera node's inputs came up)" in lines[0]


def test_an_observation_stamped_before_1970_is_refused_and_the_robot_runs_on(ros):
    """A negative header.stamp (a camera driver's clock gone wrong, a hand-made message) is no
    time a ROS message can carry back out: the chunk's observation_stamp could not be written,
    and the tick that publishes it failed. It is refused as it comes, naming the stamp, and the
    observations after it are served."""
    from builtin_interfaces.msg import Time

    prefix = unique_prefix()
    node = inference_node(ros, prefix, chunk_origin="frame_end")
    client = InferenceClient(ros, prefix, "oxygen_test_negative_stamp", node=node)
    client.observe()
    assert until(lambda: client.chunks)
    bad = observation_msg(client.seq, client.now())
    bad.header.stamp = Time(sec=-5, nanosec=0)
    client.obs.publish(bad)
    assert until(lambda: node.counters["observations_invalid"] == 1)
    seq = client.seq
    client.observe()
    assert until(lambda: any(m.observation_seq == seq for m in client.chunks)), "the next observation was not served"
    assert not node.diagnostics()["control_failure"] and node.counters["frame_errors"] == 0

"""The inference node on real DDS: a tiny model, a test client publishing Observations and Questions.

What a user sees on the node's outputs: ActionChunks at the control rate, JointTrajectories,
streamed text for periodic and on-demand requests, /diagnostics. Counts, not timing: the
machine may be loaded by other work, so the assertions ask for a fraction of the nominal
message rate and for well-formed content.
"""

import os
import threading
import time

import numpy as np
import pytest
from ros_harness import InferenceClient, check_chunks, check_text, inference_node, unique_prefix

H = 10  # tiny preset horizon
RATE = 50.0


def test_actions_at_control_rate_text_streams_and_questions(ros, random_tiny_dir):
    prefix = unique_prefix()
    # untrained weights: requests run to max_decode, so some are in flight at shutdown
    node = inference_node(ros, prefix, joint_names=["j0", "j1"], model_path=random_tiny_dir)
    client = InferenceClient(ros, prefix, node=node)

    client.publish_observations(1.0)
    client.ask("client-a", "what do you see?")
    client.publish_observations(2.0)
    assert ros.wait_until(lambda: any(m.client_id == "client-a" and m.done for m in client.text), 20.0), \
        "the question was not answered"
    ros.remove(node)  # clean shutdown: running requests end with `cancelled`
    assert ros.wait_until(lambda: any(m.finish_reason == "cancelled" for m in client.text), 10.0)
    time.sleep(0.3)

    # ActionChunks: one per tick while a chunk has actions left (count, not timing)
    chunks = list(client.chunks)
    published = node.counters["actions_published"]
    assert len(chunks) >= 0.9 * published
    # more than one chunk's worth: ticks keep publishing the newest chunk at an advancing offset
    # (the rate itself is a benchmark figure, `oxygen-agent --report`, not asserted here)
    assert published >= 2 * H, f"only {published} ActionChunks in ~3 s at {RATE} Hz: {dict(node.counters)}"
    check_chunks(chunks, horizon=H, period=1 / RATE)
    seqs = {m.observation_seq for m in chunks}
    assert seqs <= set(range(client.seq))
    assert len({m.frame_id for m in chunks}) >= 10, "chunks of too few frames"
    assert max(m.offset for m in chunks) >= 1, "offsets never advanced"

    # JointTrajectory: the first two action dimensions, one point per action from the offset on
    trajectories = list(client.trajectories)
    assert trajectories and all(list(t.joint_names) == ["j0", "j1"] for t in trajectories)
    # never a single point (a chunk's last row, held when observations stop): it ends when it starts,
    # and a joint_trajectory_controller refuses a trajectory that ends before it arrives
    assert all(len(t.points) >= 2 for t in trajectories), sorted({len(t.points) for t in trajectories})
    first = chunks[0]
    match = [t for t in trajectories if t.header.stamp == first.header.stamp]
    assert match and len(match[0].points) == first.horizon
    a = np.asarray(first.actions, dtype=np.float32).reshape(first.horizon, first.action_dim)
    np.testing.assert_allclose([p.positions for p in match[0].points], a[:, :2], rtol=1e-6)

    # text: per request in index order, each finished one ends with done + a finish reason
    finished = check_text(client.text)
    started = {m.request_id for m in client.text}
    assert started and set(finished) == started, "every request must end (finished or cancelled at shutdown)"
    reasons = {ms[-1].finish_reason for ms in finished.values()}
    assert "length" in reasons or "eos" in reasons
    periodic = [ms for ms in finished.values() if ms[0].client_id == ""]
    assert len(periodic) >= 5, "language_every_n_frames=1 starts a request per observation frame"
    answer = [ms for ms in finished.values() if ms[0].client_id == "client-a"]
    assert len(answer) == 1 and answer[0][-1].finish_reason in ("eos", "length")
    assert all(m.token_id >= 0 for m in answer[0][:-1])

    # diagnostics once a second, with the figures the brief asks for
    ours = list(client.diagnostics)
    assert ours, "no /diagnostics from the node"
    keys = {kv.key for kv in ours[-1].values}
    assert {"action_frequency_hz", "frame_latency_ms", "chunk_age_ms", "underruns", "active_batch",
            "tokens_per_s", "kv_bytes_reserved", "kv_bytes_in_use", "setting", "k", "worker_load"} <= keys
    load = float(next(kv.value for kv in ours[-1].values if kv.key == "worker_load"))
    assert 0.0 < load <= 1.0, f"worker_load {load}: the frames ran, part of the time"
    # the delay from an observation's stamp to its chunk's first tick: at least a frame, under a chunk's span
    values = {kv.key: kv.value for kv in ours[-1].values}
    delay, span = float(values["capture_to_action_ms"]), float(values["horizon"]) * 1e3 / float(values["control_rate_hz"])
    assert 0.0 < delay < span, (delay, span)
    assert float(values["observation_interval_ms"]) > 0.0, values["observation_interval_ms"]


def _worker_niceness() -> set[int]:
    """The niceness of every inference worker thread alive in this process."""
    return {os.getpriority(os.PRIO_PROCESS, t.native_id) for t in threading.enumerate()
            if t.name == "oxygen-inference-worker" and t.is_alive()}


def test_on_demand_only_and_question_before_any_observation(ros):
    prefix = unique_prefix()
    before = _worker_niceness()
    node = inference_node(ros, prefix, language_every_n_frames=0, chunk_origin="frame_end", worker_niceness=3,
                          max_observation_age=30.0)  # the answers below come well within it, on any machine
    # the frames run below the node's own priority (the tick's thread keeps it)
    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert ros.wait_until(lambda: min(own + 3, 19) in _worker_niceness() - before, 10.0), _worker_niceness()
    client = InferenceClient(ros, prefix, node=node)

    client.ask("early", "anyone there?")  # nothing to answer from yet: rejected, carrying the client id
    assert ros.wait_until(lambda: any(m.client_id == "early" for m in client.text), 10.0)
    early = [m for m in client.text if m.client_id == "early"]
    assert len(early) == 1 and early[0].done and early[0].finish_reason == "rejected" and early[0].token_id == -1
    assert early[0].reason == "no observation has arrived yet", early[0].reason  # why, on the topic too

    client.publish_observations(1.0)
    assert ros.wait_until(lambda: len(client.chunks) >= 5, 10.0)
    assert [m for m in client.text if m.client_id != "early"] == [], "language_every_n_frames=0: no periodic text"
    # frame_end origin: every frame's chunk is first published at offset 0
    by_frame = {}
    for m in list(client.chunks):
        by_frame.setdefault(m.frame_id, m.offset)
    assert set(by_frame.values()) == {0}

    client.ask("late", "and now?")
    client.ask("later", "and again?")
    # no more observations: idle decoding (decode_when_idle) finishes the answers
    assert ros.wait_until(lambda: sum(m.done for m in client.text if m.client_id in ("late", "later")) == 2, 20.0)
    answers = check_text([m for m in client.text if m.client_id in ("late", "later")])
    assert {ms[0].client_id for ms in answers.values()} == {"late", "later"}
    assert all(ms[-1].finish_reason in ("eos", "length") for ms in answers.values())
    assert node.counters["language_frames"] >= 1

    # the camera has stopped: once its newest observation is older than max_observation_age, a
    # question is refused, not answered from that old image as if it were now
    from rclpy.parameter import Parameter

    assert node.set_parameters([Parameter("max_observation_age", value=0.2)])[0].successful
    time.sleep(0.3)
    client.ask("stale", "and now?")
    assert ros.wait_until(lambda: any(m.client_id == "stale" and m.done for m in client.text), 10.0)
    stale = [m for m in client.text if m.client_id == "stale"]
    assert [(m.finish_reason, m.token_id) for m in stale] == [("rejected", -1)]
    assert stale[0].reason.startswith("the newest observation is ") and "max_observation_age 0.2 s" in stale[0].reason
    assert all(m.reason == "" for m in client.text if m.client_id in ("late", "later")), "answered: no reason"
    assert node.counters["questions_rejected_stale"] == 1


@pytest.mark.parametrize("hold", ["last", "none"])
def test_no_joint_trajectory_of_one_point_goes_out_when_a_chunk_runs_down(ros, random_tiny_dir, hold):
    """The observations stop: the ticks publish the chunk's last rows, then (hold_action last) hold
    its last row. A trajectory of one point ends when it starts, before it arrives, and a
    joint_trajectory_controller refuses it ("ends in the past", an ERROR a tick while held); the
    ActionChunks go out as before."""
    prefix = unique_prefix()
    node = inference_node(ros, prefix, joint_names=["j0", "j1"], model_path=random_tiny_dir, hold_action=hold,
                          language_every_n_frames=0)
    client = InferenceClient(ros, prefix, node=node)
    client.publish_observations(1.0)
    time.sleep(1.0)  # H / 50 Hz = 0.2 s of rows, then holds (or underruns)
    chunks, trajectories = list(client.chunks), list(client.trajectories)
    assert any(len(c.actions) == c.action_dim for c in chunks), "no tick with one row left"  # the test's premise
    assert trajectories and all(len(t.points) >= 2 for t in trajectories), \
        sorted({len(t.points) for t in trajectories})
    if hold == "last":
        assert any(c.offset >= c.horizon for c in chunks), "no hold"


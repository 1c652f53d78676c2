"""The inference node under faults: camera drop-out and stale data (hold_action), overload
(the language budget shrinks before an action is late), admission (requests that cannot
be admitted are rejected, never dropped), model faults (one failure is survived, repeated
failures stop the action output, non-finite actions are never published).

Real inference nodes on real DDS; the *model* is slowed or broken by wrapping its
methods. Counts and contents are checked, never durations.
"""

import math
import threading
import time

import numpy as np
import pytest
from ros_harness import InferenceClient, check_chunks, check_text, inference_node, unique_prefix, until

H = 10  # tiny preset horizon


def _node(ros, prefix, **params):
    return inference_node(ros, prefix, **{"frame_deadline_ms": 5000.0, **params})


def _diag_values(status):
    return {kv.key: kv.value for kv in status.values}


class Feeder:
    """Publishes observations at `rate_hz` in a background thread while `on` is set."""

    def __init__(self, client, rate_hz=20.0):
        self.client, self.period = client, 1.0 / rate_hz
        self.on = threading.Event()
        self.stop = threading.Event()
        self.age_s = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            if self.on.is_set():
                self.client.observe(self.age_s)
            time.sleep(self.period)

    def close(self):
        self.stop.set()
        self.thread.join(5.0)


@pytest.fixture
def feeder_factory():
    made = []

    def make(client, rate_hz=20.0):
        made.append(Feeder(client, rate_hz))
        return made[-1]

    yield make
    for f in made:
        f.close()


def test_camera_dropout_and_stale_observations_then_hold_last_and_recovery(ros, feeder_factory):
    from rclpy.parameter import Parameter

    prefix = unique_prefix()
    node = _node(ros, prefix, max_observation_age=0.3, language_every_n_frames=0, chunk_origin="frame_end")
    client = InferenceClient(ros, prefix, "oxygen_test_fault_client", node=node)
    feed = feeder_factory(client)
    feed.on.set()
    assert until(lambda: node.counters["frames"] >= 5 and len(client.chunks) >= 5)

    # drop-out (hold_action none): once the chunk runs out nothing is published and underruns are counted
    feed.on.clear()
    assert until(lambda: node.tick_counts()["underruns"] >= 5)
    for _ in range(3):  # a frame already in flight when the feed stopped may still end: measure after it
        frames = node.counters["frames"]
        published = node.counters["actions_published"]
        underruns = node.tick_counts()["underruns"]
        assert until(lambda: node.tick_counts()["underruns"] >= underruns + 10)
        if node.counters["frames"] == frames:
            break
    assert node.counters["frames"] == frames, "frames kept starting without fresh observations"
    assert node.counters["actions_published"] == published, "an action was published from a used-up chunk"
    assert until(lambda: any("underruns" in s.message and "no fresh observation" in s.message
                             for s in client.diagnostics), timeout=15.0), [s.message for s in client.diagnostics]

    # stale observations (2 s old, max_observation_age 0.3 s): no frame starts from them
    frames = node.counters["frames"]
    feed.age_s = 2.0
    feed.on.set()
    assert until(lambda: node.counters["observations_stale"] >= 10)
    assert node.counters["frames"] == frames and node.counters["actions_published"] == published
    assert until(lambda: any("stale observations not used" in s.message for s in client.diagnostics),
                 timeout=15.0)

    # fresh frames again: resumes by itself
    feed.age_s = 0.0
    assert until(lambda: node.counters["frames"] >= frames + 3 and node.counters["actions_published"] > published)

    # hold_action last (set at run time): the last row is repeated, marked offset = H, one row
    result = node.set_parameters([Parameter("hold_action", value="last")])[0]
    assert result.successful, result.reason
    feed.on.clear()
    assert until(lambda: node.counters["hold_ticks"] >= 10)
    underruns_with_hold = node.tick_counts()["underruns"]
    assert underruns_with_hold >= underruns + 10  # still counted as underruns
    feed.on.set()
    assert until(lambda: node.counters["frames"] >= frames + 10 and client.chunks and client.chunks[-1].offset < H)
    feed.on.clear()

    chunks = list(client.chunks)
    holds = [m for m in chunks if m.offset >= H]
    normal = [m for m in chunks if m.offset < H]
    assert len(holds) >= 10
    assert all(m.offset == H and m.horizon == 1 for m in holds)
    check_chunks(normal, horizon=H)
    stamps = [m.header.stamp.sec * 10**9 + m.header.stamp.nanosec for m in chunks]
    assert all(b > a for a, b in zip(stamps, stamps[1:])), "header stamps must increase through holds and back"
    assert all(math.isfinite(v) for m in chunks for v in m.actions)
    by_frame = {}
    for m in normal:
        by_frame[m.frame_id] = m
    for m in holds:  # the row held is the last row of the chunk it came from, with its stamps
        src = by_frame[m.frame_id]
        a = np.asarray(src.actions, np.float32).reshape(src.horizon, src.action_dim)
        assert np.array_equal(np.asarray(m.actions, np.float32), a[-1])
        assert m.observation_stamp == src.observation_stamp and m.observation_seq == src.observation_seq
    # the age of a hold grows: header.stamp - observation_stamp increases along a run of holds
    ages = [(m.header.stamp.sec - m.observation_stamp.sec) * 10**9 + m.header.stamp.nanosec
            - m.observation_stamp.nanosec for m in holds if m.frame_id == holds[0].frame_id]
    assert ages == sorted(ages) and ages[-1] > ages[0]
    assert until(lambda: any("holding the last action" in s.message for s in client.diagnostics), timeout=15.0)


def test_overload_shrinks_the_language_budget_to_zero_and_it_comes_back(ros, feeder_factory):
    prefix = unique_prefix()
    node = _node(ros, prefix, frame_deadline_ms=200.0, steps_per_frame=5, max_decode=30, chunk_origin="frame_end")
    client = InferenceClient(ros, prefix, "oxygen_test_fault_client", node=node)
    slow = {"s": 0.0}
    denoise = node.engine.model.denoise

    def slow_denoise(*args, **kwargs):
        time.sleep(slow["s"])
        return denoise(*args, **kwargs)

    node.engine.model.denoise = slow_denoise
    feed = feeder_factory(client)
    feed.on.set()
    assert until(lambda: len(node.loop.k_history) >= 3 and node.loop.k_history[-1][1] == 5), list(node.loop.k_history)[-5:]

    slow["s"] = 0.5  # a slow device: the action part alone takes more than the 200 ms deadline
    mark = node.engine.frame_id
    assert until(lambda: any(f > mark and k == 0 for f, k, _ in list(node.loop.k_history)))
    assert until(lambda: any(_diag_values(s).get("k") == "0" and "language budget k=0" in s.message
                             for s in client.diagnostics), timeout=15.0)
    assert node.loop.budget.next_k() == 0

    slow["s"] = 0.0  # headroom again: the budget grows back to steps_per_frame
    mark = node.engine.frame_id
    assert until(lambda: any(f > mark and k == 5 for f, k, _ in list(node.loop.k_history)))
    ks = [k for f, k, _ in list(node.loop.k_history)]
    assert 0 in ks and ks[-1] == 5 and all(0 <= k <= 5 for k in ks)

    # decode_budget false (deterministic replays): steps_per_frame whatever the frame time
    from rclpy.parameter import Parameter

    assert node.set_parameters([Parameter("decode_budget", value=False)])[0].successful
    slow["s"] = 0.5
    mark = node.engine.frame_id
    assert until(lambda: sum(1 for f, k, obs in list(node.loop.k_history) if f > mark and obs) >= 3)
    assert all(k == 5 for f, k, _ in list(node.loop.k_history) if f > mark) and node.loop.budget.next_k() == 0
    slow["s"] = 0.0
    feed.on.clear()
    # no request lost a token: indices are contiguous per request, whatever k was
    check_text(client.text)
    check_chunks(list(client.chunks), horizon=H)


def test_requests_that_cannot_be_admitted_are_rejected_never_dropped(ros, feeder_factory, random_tiny_dir):
    prefix = unique_prefix()
    # untrained weights: answers run to max_decode, so the one slot stays busy
    node = _node(ros, prefix, model_path=random_tiny_dir, language_every_n_frames=0, max_active=1,
                 queue_limit=1, max_decode=6,
                 steps_per_frame=1, decode_when_idle=False)
    client = InferenceClient(ros, prefix, "oxygen_test_fault_client", node=node)
    feed = feeder_factory(client, rate_hz=10.0)
    feed.on.set()
    assert until(lambda: node.counters["frames"] >= 2)
    feed.on.clear()
    time.sleep(0.3)  # let the last frame end: the four questions then meet one idle worker
    names = [f"q{i}" for i in range(4)]
    for name in names:
        client.ask(name)
    assert until(lambda: sum(1 for m in client.text if m.done and m.client_id in names) >= 2)
    feed.on.set()  # frames again: the admitted requests decode to their end
    assert until(lambda: {m.client_id for m in client.text if m.done} >= set(names))
    feed.on.clear()
    finished = check_text(client.text)
    ends = {}
    for m in client.text:
        if m.done:
            ends.setdefault(m.client_id, []).append(m.finish_reason)
    assert all(len(v) == 1 for v in ends.values()), ends  # one end per question
    reasons = sorted(ends[n][0] for n in names)
    assert reasons.count("rejected") == 2 and all(r in ("eos", "length") for r in reasons if r != "rejected")
    for ms in finished.values():  # tokens received == the final index says
        real = [m for m in ms if m.token_id >= 0]
        assert len(real) == ms[-1].index + (1 if ms[-1].token_id >= 0 else 0)


def test_frame_failures_one_survived_repeated_stop_the_actions_then_recovery(ros, feeder_factory):
    prefix = unique_prefix()
    node = _node(ros, prefix, max_consecutive_failures=3, language_every_n_frames=2, chunk_origin="frame_end")
    client = InferenceClient(ros, prefix, "oxygen_test_fault_client", node=node)
    fail = {"n": 0}
    denoise = node.engine.model.denoise

    def broken(*args, **kwargs):
        if fail["n"] > 0:
            fail["n"] -= 1
            raise RuntimeError("injected model fault")
        return denoise(*args, **kwargs)

    node.engine.model.denoise = broken
    feed = feeder_factory(client)
    feed.on.set()
    assert until(lambda: node.counters["frames"] >= 3)

    # one failure: logged and counted; the next frame runs, the output never stops
    frames, errors = node.counters["frames"], node.counters["frame_errors"]
    fail["n"] = 1
    assert until(lambda: node.counters["frame_errors"] == errors + 1 and node.counters["frames"] > frames + 2)
    assert not node.diagnostics()["faulted"]

    # repeated failures: the action output stops (current chunk dropped), ERROR in diagnostics
    fail["n"] = 10**9
    assert until(lambda: node.diagnostics()["faulted"])
    ticks_faulted = node.counters["ticks_faulted"]
    # a tick that had passed its check before the chunk was dropped may still publish its row:
    # count from the first tick seen faulted (every later tick sees the empty slot)
    assert until(lambda: node.counters["ticks_faulted"] > ticks_faulted)
    node.diagnostics()  # a sync under the node's lock: every count up to that faulted tick is in
    published, ticks_faulted = node.counters["actions_published"], node.counters["ticks_faulted"]
    assert until(lambda: node.counters["ticks_faulted"] >= ticks_faulted + 10
                 and node.counters["frame_errors"] >= errors + 6)
    assert node.counters["actions_published"] == published, "actions published while faulted"
    assert until(lambda: any(s.level == b"\x02" and "action output stopped" in s.message
                             and "injected model fault" in s.message for s in client.diagnostics), timeout=15.0)

    # a frame succeeds: the output resumes by itself
    fail["n"] = 0
    assert until(lambda: not node.diagnostics()["faulted"] and node.counters["actions_published"] > published)
    assert until(lambda: client.diagnostics and client.diagnostics[-1].level != b"\x02", timeout=15.0)
    check_chunks(list(client.chunks), horizon=H)
    check_text(client.text)


def test_a_fault_in_language_work_loses_no_action(ros, feeder_factory):
    """Every decode step fails: each frame is a failed frame (counted, logged), yet its action
    chunk, denoised before the fault, is published, and the action output never stops. The
    camera is slow (4 Hz): language-only frames run between its observations, and fail too,
    without counting towards stopping the actions (no action was due from them). The frame
    time /diagnostics reports (``frame_latency_ms``, ``action_frequency_hz``) is that of the
    frames that gave a chunk without an error: a failed frame's time says nothing of the next."""
    from oxygen_ros.core.engine import FrameError

    prefix = unique_prefix()
    node = _node(ros, prefix, max_consecutive_failures=2, chunk_origin="frame_end")
    client = InferenceClient(ros, prefix, "oxygen_test_fault_client", node=node)

    def broken(*args, **kwargs):
        raise RuntimeError("injected decode fault")

    node.engine.model.decode_step = broken
    good_ms, failed_with_chunks, timed_ms = [], [], []  # frames with a chunk: succeeded, failed; what was timed
    step, frame_ms = node.engine.step, node.worker.frame_ms

    def recorded_step(observations, *args, **kwargs):
        try:
            result = step(observations, *args, **kwargs)
        except FrameError as exc:
            if exc.result.actions:
                failed_with_chunks.append(exc.result.total_ms)
            raise
        if result.actions:
            good_ms.append(result.total_ms)
        return result

    def recorded_add(ms):
        timed_ms.append(ms)
        frame_ms.__class__.add(frame_ms, ms)

    node.engine.step, frame_ms.add = recorded_step, recorded_add
    feed = feeder_factory(client, rate_hz=4.0)
    feed.on.set()
    # language-only frames failed between the observation frames (each frame fails, its errors count)
    assert until(lambda: node.counters["frames"] >= 6 and node.counters["frame_errors"] >= node.counters["frames"] + 6,
                 30.0), node.counters
    published = node.counters["actions_published"]
    assert until(lambda: node.counters["actions_published"] > published + 10)
    assert not node.diagnostics()["faulted"], "the action output stopped for a language fault"
    assert node.counters["ticks_faulted"] == 0, "the action output stopped for a while"
    check_chunks(list(client.chunks), horizon=H)
    assert node.engine.pool.held <= node.engine.config.max_active
    timed, good = list(timed_ms), list(good_ms)  # (the frame after the last timed one may be running)
    assert len(failed_with_chunks) >= 3, "observation frames failed after their chunk was denoised"
    assert timed == good[:len(timed)] and len(good) - len(timed) <= 1, (timed, good, failed_with_chunks)


def test_a_non_finite_chunk_in_a_frame_that_then_fails_is_one_failure(ros):
    """One frame whose chunk is non-finite and whose decoding then fails counts once towards
    max_consecutive_failures (2 here): the action output does not stop for it."""
    prefix = unique_prefix()
    node = _node(ros, prefix, max_consecutive_failures=2, chunk_origin="frame_end", decode_when_idle=False)
    client = InferenceClient(ros, prefix, "oxygen_test_fault_client", node=node)
    armed = {"on": False}
    denoise, decode = node.engine.model.denoise, node.engine.model.decode_step

    def poisoned(*args, **kwargs):
        out = denoise(*args, **kwargs)
        if armed["on"]:
            out = out.clone()
            out[..., 0, 0] = math.nan
        return out

    def broken(*args, **kwargs):
        if armed["on"]:
            armed["on"] = False  # this frame only
            raise RuntimeError("injected decode fault")
        return decode(*args, **kwargs)

    node.engine.model.denoise, node.engine.model.decode_step = poisoned, broken
    assert until(lambda: node.counters["frames"] >= 3, 30.0, every=client.observe, period=0.1)
    errors, armed["on"] = node.counters["frame_errors"], True
    assert until(lambda: node.counters["frame_errors"] > errors, 30.0, every=client.observe, period=0.1)
    assert node.counters["actions_non_finite"] == 1
    mark = node.counters["frames"]
    assert until(lambda: node.counters["frames"] >= mark + 3, 30.0, every=client.observe, period=0.1)
    assert not node.diagnostics()["faulted"]  # (its figures bring the control process's counts in)
    assert node.counters["ticks_faulted"] == 0, "the action output stopped for one failed frame"


def test_non_finite_actions_are_never_published(ros, feeder_factory):
    prefix = unique_prefix()
    node = _node(ros, prefix, max_consecutive_failures=3, language_every_n_frames=0, chunk_origin="frame_end")
    client = InferenceClient(ros, prefix, "oxygen_test_fault_client", node=node)
    poison = {"n": 0, "frames": []}
    denoise = node.engine.model.denoise

    def poisoned(*args, **kwargs):
        out = denoise(*args, **kwargs)
        if poison["n"] > 0:
            poison["n"] -= 1
            poison["frames"].append(node.engine.frame_id)
            out = out.clone()
            out[..., 0, 0] = math.nan if poison["n"] % 2 else math.inf
        return out

    node.engine.model.denoise = poisoned
    feed = feeder_factory(client)
    feed.on.set()
    assert until(lambda: node.counters["frames"] >= 3)
    poison["n"] = 2  # fewer than max_consecutive_failures: the previous chunk plays on
    assert until(lambda: node.counters["actions_non_finite"] == 2 and node.counters["frames"] >= 6)
    assert not node.diagnostics()["faulted"]
    poison["n"] = 5  # more: the output stops until a finite chunk arrives
    assert until(lambda: node.counters["actions_non_finite"] == 7)
    assert until(lambda: node.counters["actions_published"] > 0 and not node.diagnostics()["faulted"])
    mark = node.counters["frames"]
    assert until(lambda: node.counters["frames"] >= mark + 3)
    feed.on.clear()
    time.sleep(0.3)
    chunks = list(client.chunks)
    check_chunks(chunks, horizon=H)  # every value finite
    assert not {m.frame_id for m in chunks} & set(poison["frames"])
    assert len(poison["frames"]) == 7 and node.counters["ticks_faulted"] > 0


def test_a_frame_worker_that_stops_is_an_error_naming_why(ros):
    """A fault outside any frame (here in choosing the next job) ends the worker thread: no
    frame runs any more and the actions run out. /diagnostics says so, as an ERROR with the
    exception, instead of only the underruns that follow (the node itself goes on)."""
    from diagnostic_msgs.msg import DiagnosticStatus

    prefix = unique_prefix()
    node = _node(ros, prefix)
    client = InferenceClient(ros, prefix, "oxygen_test_worker_client", node=node)
    assert until(lambda: node.counters["frames"] >= 2, 30.0, every=client.observe, period=0.1)
    assert node.diagnostics()["worker_failure"] == ""

    def broken(*args, **kwargs):
        raise RuntimeError("injected fault choosing a job")

    node.loop.next_job = broken
    assert until(lambda: node.worker.died, 10.0, every=client.observe, period=0.1)
    assert node.diagnostics()["worker_failure"] == "RuntimeError: injected fault choosing a job"
    level, message = node.diagnostic_status()
    assert level == DiagnosticStatus.ERROR
    assert "frame worker stopped: RuntimeError: injected fault choosing a job" in message, message


def test_a_second_node_of_the_same_name_on_the_network_is_warned_of(ros, monkeypatch):
    """Two agents on one ROS_DOMAIN_ID (two people in a lab, both at the default 0): both inference
    nodes publish on /oxygen/actions, and each robot takes either's chunks. Nothing said so (an
    integrator's walkthrough: lifecycle calls answered for the other node). /diagnostics warns,
    naming the node and the domain (and the console, at most every 5 s)."""
    from diagnostic_msgs.msg import DiagnosticStatus

    monkeypatch.setenv("ROS_DOMAIN_ID", "17")  # (read for the message only)
    prefix = unique_prefix()
    first = inference_node(ros, prefix)
    assert first.diagnostics()["same_name_nodes"] == 0
    assert "other node(s) named" not in first.diagnostic_status()[1]
    inference_node(ros, prefix)  # the same name, in the same namespace
    assert until(lambda: first.diagnostics()["same_name_nodes"] == 1, 10.0)
    level, message = first.diagnostic_status()
    assert level == DiagnosticStatus.WARN
    assert (f"1 other node(s) named {prefix}/oxygen_inference on this ROS network (ROS_DOMAIN_ID 17): another "
            "agent: a parameter, lifecycle or Ask call by that name reaches either") in message, message


def test_another_publisher_on_the_actions_topic_is_warned_of(ros):
    """Two stacks whose nodes are named apart but whose actions go out on one topic (an integrator's
    walkthrough: two namespaced stacks on absolute topic names; the name check said nothing): a robot
    takes either's chunks. /diagnostics counts the other publishers and warns, naming the topic."""
    from oxygen_ros.msg import ActionChunk

    prefix = unique_prefix()
    first = inference_node(ros, prefix)
    assert until(lambda: first.count_publishers(f"{prefix}/actions") >= 1, 10.0)
    assert first.diagnostics()["other_action_publishers"] == 0
    ros.node("oxygen_test_second_agent").create_publisher(ActionChunk, f"{prefix}/actions", 10)
    assert until(lambda: first.diagnostics()["other_action_publishers"] == 1, 10.0)
    message = first.diagnostic_status()[1]
    assert f"1 other publisher(s) on {prefix}/actions: another agent or a bag playing it" in message, message

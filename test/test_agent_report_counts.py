"""The agent report's totals are the sums of its per-robot figures, even though the
inference node's control ticks go on publishing while the report reads them
(``oxygen-agent robots:=a,b --report``: a user adds up the robots' rows); each robot's
latency is taken apart against its own record of a frame that served several."""

import time
from types import SimpleNamespace

import pytest

from oxygen_ros.core.active_time import ActiveTime
from oxygen_ros.core.frame_records import FrameRecord
from oxygen_ros.tools.agent_report import Measurement

MS = 1_000_000


class TickingNode:
    """The inference node's read side as the report uses it, with two robots that have
    published a chunk; robot b's control tick publishes during the report's fifth read
    of the tick counts (on a live node ticks land anywhere between two reads)."""

    robot_names = ("a", "b")
    params = {"control_rate_hz": 50.0, "setting": "oxygen", "steps_per_frame": 5}
    horizon = 10
    loaded = SimpleNamespace(source="test")
    engine = SimpleNamespace(compiled=None, compile_reason="compile is off", recompiles=0)
    configured = True

    def __init__(self):
        self.published = {"a": 1, "b": 1}
        self.counters = {"actions_published": 2, "frames": 0}
        self.reads = 0
        self.tick_lateness_ms = SimpleNamespace(values=lambda: [], total=0)
        self.clock = 100.0  # the node's active time runs on this clock: a test moves it
        self.ticking = ActiveTime(lambda: self.clock)
        self.ticking.start()

    def publish_tick(self, robots=("a", "b")) -> None:
        for robot in robots:
            self.published[robot] += 1
            self.counters["actions_published"] += 1

    def tick_counts(self, robot=None):
        self.reads += 1
        if self.reads == 5:
            self.publish_tick(("b",))
        n = self.published[robot or "a"]
        return {"ticks": n, "published": n, "underruns": 0, "waiting": 0}

    def diagnostics(self, robot=None):
        return {"frame_latency_ms": 1.0, "frame_latency_p99_ms": 1.0, "action_frequency_hz": 50.0}

    def frame_records(self, robot=None):
        return {}


def test_top_level_actions_published_is_the_sum_of_the_robots_while_ticks_go_on():
    node = TickingNode()
    m = Measurement(node)
    m.poll()  # the window starts
    assert m.start is not None
    for _ in range(5):
        node.publish_tick()
    m.freeze()
    report = m.report()
    per_robot = {r: f["actions_published"] for r, f in report["robots"].items()}
    assert all(n > 0 for n in per_robot.values()), per_robot
    assert report["actions_published"] == sum(per_robot.values()), (report["actions_published"], per_robot)


class SharedFrameNode(TickingNode):
    """Frame 7 served both robots: a's observation went straight in, b's waited 30 ms for the
    worker; the engine took 10 ms and the tick 5 ms for both."""

    def __init__(self):
        super().__init__()
        self.records = {}

    def tick_counts(self, robot=None):
        n = self.published[robot or "a"]
        return {"ticks": n, "published": n, "underruns": 0, "waiting": 0}

    def frame_records(self, robot=None):
        return self.records.get(robot, {})


def test_the_tick_rate_counts_the_seconds_the_node_was_active_not_a_deactivated_spell():
    """A lifecycle node active 2 s, deactivated 3 s, active 2 s again (and shut down before the
    agent's window ends): 50 ticks per active second is 50 Hz, not 4 s of ticks over 7 s."""
    node = SharedFrameNode()
    m = Measurement(node)
    m.poll()
    for spell in (2.0, None, 2.0):
        if spell is None:
            node.ticking.stop()
            node.clock += 3.0
            node.ticking.start()
            continue
        for _ in range(int(spell * 50)):
            node.publish_tick()
        node.clock += spell
    node.ticking.stop()
    node.clock += 0.5  # a shutdown that takes its time: no ticks
    m.freeze()
    report = m.report()
    assert report["active_s"] == pytest.approx(4.0)
    assert report["tick_rate_hz"] == pytest.approx(50.0)
    assert {r: f["tick_rate_hz"] for r, f in report["robots"].items()} == {"a": pytest.approx(50.0),
                                                                           "b": pytest.approx(50.0)}


def test_a_frame_shared_by_robots_is_taken_apart_with_each_robot_s_own_record():
    node = SharedFrameNode()
    m = Measurement(node)
    m.poll()
    t0, ns0 = m.start["t"], m.start["t_ns"]
    for robot, queue_wait in (("a", 0), ("b", 30)):
        dequeued = ns0 + 100 * MS
        node.records[robot] = {7: FrameRecord(7, 1, dequeued - queue_wait * MS, dequeued, dequeued, dequeued + 10 * MS,
                                              10.0, 0.0, dequeued + 15 * MS)}
    # the subscriber's latency: 1 ms of DDS each way around queue wait + engine + tick wait
    probed = {"a": {"arrivals": [t0 + 0.2], "first_actions": {7: [1, t0 + 0.017, t0]}},
              "b": {"arrivals": [t0 + 0.2], "first_actions": {7: [1, t0 + 0.047, t0]}}}
    node.publish_tick()
    time.sleep(0.25)
    m.freeze()
    report = m.report(probed)
    assert report["ros_overhead_p50_ms"] == pytest.approx(2.0) and report["ros_overhead_p99_ms"] == pytest.approx(2.0)
    assert report["queue_wait_p50_ms"] == pytest.approx(15.0)  # both records count: 0 and 30 ms


def test_figures_nothing_measured_are_none_not_zero():
    """No probe, several robots: nothing in the agent received the actions (not 0 of them)."""
    node = TickingNode()
    m = Measurement(node)
    m.poll()
    m.freeze()
    assert m.report()["actions_received"] is None


class SilentNode(TickingNode):
    """Two robots whose ticks never had a chunk: 500 ticks each, all waiting, their lateness recorded."""

    def __init__(self):
        super().__init__()
        from oxygen_ros.core.stats import Rolling

        self.ticks = {"a": 0, "b": 0}
        self.tick_lateness_ms = Rolling(1000)

    def tick_counts(self, robot=None):
        n = self.ticks[robot or "a"]
        return {"ticks": n, "published": 0, "underruns": 0, "waiting": n}


def test_a_run_that_never_published_a_chunk_has_no_window_figures_and_says_what_waited():
    node = SilentNode()
    m = Measurement(node)
    m.poll()
    assert m.start is None  # no chunk: the window never starts
    node.ticks = {"a": 500, "b": 500}
    for i in range(500):
        node.tick_lateness_ms.add(0.1 + i / 100)
    m.freeze()
    report = m.report()
    assert report["tick_lateness_p50_ms"] is None and report["tick_lateness_p99_ms"] is None
    assert report["duration_s"] is None and report["active_s"] is None and report["tick_rate_hz"] is None
    assert {r: f["ticks_waiting"] for r, f in report["robots"].items()} == {"a": 500, "b": 500}
    assert all(f["underruns"] == 0 and f["actions_published"] == 0 for f in report["robots"].values())


def _window_with_arrivals(node, spacing_s: float, change_rate_to: tuple[float, ...] = ()) -> dict:
    """A window of 20 ActionChunk arrivals ``spacing_s`` apart, measured in the agent process;
    ``control_rate_hz`` set to each of ``change_rate_to`` in turn during it."""
    m = Measurement(node, measure=True)
    t0 = time.monotonic()
    for i in range(20):
        m.actions.append((t0 + i * spacing_s, i, i))
    m.poll()
    for rate in change_rate_to:  # `ros2 param set` during the run, as the node counts it
        node.params["control_rate_hz"] = rate
        node.counters["control_rate_changes"] = node.counters.get("control_rate_changes", 0) + 1
    m.freeze()
    m.end["actions"] = len(m.actions)
    return m.report()


def test_the_jitter_is_measured_against_the_control_period_of_the_window():
    node = TickingNode()
    node.params = dict(node.params)
    report = _window_with_arrivals(node, 0.020)
    assert report["tick_jitter_p99_ms"] == pytest.approx(0.0, abs=1e-6)
    assert report["control_rate_changed_hz"] is None


def test_a_control_rate_changed_during_the_window_gives_no_jitter_against_a_wrong_period():
    node = TickingNode()
    node.params = dict(node.params)
    report = _window_with_arrivals(node, 0.010, change_rate_to=(100.0,))
    # measured against the 20 ms period of the start, every 10 ms interval would read 10 ms of jitter
    assert report["tick_jitter_p99_ms"] is None and report["tick_jitter_p50_ms"] is None
    assert report["control_rate_changed_hz"] == [50.0, 100.0]
    assert report["control_rate_hz"] == 100.0
    assert all(r["tick_jitter_p99_ms"] is None for r in report["robots"].values())


def test_a_control_rate_changed_and_set_back_during_the_window_still_says_so():
    """50 -> 25 -> 50 Hz: the same rate at both ends, and half the window at 25 Hz (the
    report gave jitter p99 19.95 ms against 50 Hz for such a run)."""
    node = TickingNode()
    node.params = dict(node.params)
    report = _window_with_arrivals(node, 0.040, change_rate_to=(25.0, 50.0))
    assert report["tick_jitter_p99_ms"] is None
    assert report["control_rate_changed_hz"] == [50.0, 50.0]
    assert all(r["tick_jitter_p99_ms"] is None for r in report["robots"].values())


class UnderrunNode(SharedFrameNode):
    """Each robot ran 3 ticks short of a chunk before its first one went out (the start-up
    underruns a user does not want in the report's window)."""

    def __init__(self):
        super().__init__()
        self.underruns = {"a": 3, "b": 3}

    def tick_counts(self, robot=None):
        n = self.published[robot or "a"]
        return {"ticks": n + self.underruns[robot or "a"], "published": n, "underruns": self.underruns[robot or "a"],
                "waiting": 0}


def test_the_underruns_reported_are_those_of_the_window_not_of_the_whole_run():
    node = UnderrunNode()
    m = Measurement(node)
    m.poll()  # the window starts with 6 underruns behind it
    node.publish_tick()
    node.underruns["b"] += 2  # robot b's camera stalls for two ticks in the window
    m.freeze()
    report = m.report()
    assert report["robots"]["a"]["underruns"] == 0 and report["robots"]["b"]["underruns"] == 2
    assert report["underruns"] == 2, report["underruns"]


def test_a_robot_s_latencies_are_those_of_the_chunks_that_arrived_in_the_window():
    """The probe recorded robot a's first chunk of frame 3 before the window (a 500 ms start-up
    latency) and frame 7's in it (20 ms): only frame 7's is the window's."""
    node = SharedFrameNode()
    m = Measurement(node)
    m.poll()
    t0 = m.start["t"]
    probed = {r: {"arrivals": [t0 + 0.02],
                  "first_actions": {3: [1, t0 - 0.5, t0 - 1.0], 7: [2, t0 + 0.02, t0]}} for r in ("a", "b")}
    node.publish_tick()
    time.sleep(0.05)
    m.freeze()
    report = m.report(probed)
    assert report["robots"]["a"]["obs_to_action_p99_ms"] == pytest.approx(20.0, abs=0.01)
    assert report["obs_to_action_p99_ms"] == pytest.approx(20.0, abs=0.01)

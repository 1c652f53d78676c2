"""The agent report's totals are the sums of its per-robot figures, even though the
inference node's control ticks go on publishing while the report reads them
(``oxygen-agent robots:=a,b --report``: a user adds up the robots' rows)."""

from types import SimpleNamespace

from oxygen_ros.tools.agent_report import Measurement


class TickingNode:
    """The inference node's read side as the report uses it, with two robots that have
    published a chunk; robot b's control tick publishes during the report's fifth read
    of the tick counts (on a live node ticks land anywhere between two reads)."""

    robot_names = ("a", "b")
    params = {"control_rate_hz": 50.0, "setting": "oxygen", "steps_per_frame": 5}
    horizon = 10
    loaded = SimpleNamespace(source="test")

    def __init__(self):
        self.published = {"a": 1, "b": 1}
        self.counters = {"actions_published": 2, "frames": 0}
        self.reads = 0
        self.tick_lateness_ms = SimpleNamespace(values=lambda: [], total=0)

    def _tick(self, robots=("a", "b")) -> None:
        for robot in robots:
            self.published[robot] += 1
            self.counters["actions_published"] += 1

    def tick_counts(self, robot=None):
        self.reads += 1
        if self.reads == 5:
            self._tick(("b",))
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
        node._tick()
    m.freeze()
    report = m.report()
    per_robot = {r: f["actions_published"] for r, f in report["robots"].items()}
    assert all(n > 0 for n in per_robot.values()), per_robot
    assert report["actions_published"] == sum(per_robot.values()), (report["actions_published"], per_robot)

"""The control tick's own thread (oxygen_ros/ros/control_thread.py): ticks on the period
grid, late ticks skipped instead of bursting, period changes, a clean stop, the
real-time priority asked for (or why not); on the inference node: actions keep coming
while the node's executor is stuck in a callback, and with use_sim_time the ticks
follow /clock.

Durations are not asserted as speed: the stall tests compare gaps of tens of ms
against a stall of 300 ms (or a frozen clock)."""

import os
import threading
import time
import types

import pytest
from ros_harness import InferenceClient, inference_node, reliable, unique_prefix, until

PERIOD_NS = 10_000_000


def _policy_in_thread(priority: int):
    from oxygen_ros.ros.process import realtime_priority

    out = {}

    def run():
        out["error"] = realtime_priority(priority)
        out["policy"] = os.sched_getscheduler(0)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return out["error"], out["policy"]


def test_realtime_priority_sets_fifo_or_says_why_and_zero_leaves_the_thread_alone():
    error, policy = _policy_in_thread(0)
    assert error is None and policy == os.SCHED_OTHER
    error, policy = _policy_in_thread(100)  # out of SCHED_FIFO's range: refused, named, thread unchanged
    assert error and "rtprio" in error and policy == os.SCHED_OTHER
    error, policy = _policy_in_thread(10)
    assert (error is None and policy == os.SCHED_FIFO) or (error and policy == os.SCHED_OTHER)


class _Ticks:
    """Records every tick; ``slow`` makes the next tick take that long."""

    def __init__(self):
        self.ticks, self.slow = [], 0.0

    def __call__(self, scheduled_ns: int, actual_ns: int) -> None:
        self.ticks.append((scheduled_ns, actual_ns))
        if self.slow:
            slow, self.slow = self.slow, 0.0
            time.sleep(slow)


def _control(ros, ticks, priority=0):
    from oxygen_ros.ros.control_thread import ControlThread

    node = ros.node("oxygen_test_control")
    control = ControlThread(node, PERIOD_NS, ticks, priority, node.get_logger())
    control.start()
    return control


def test_ticks_fall_on_the_period_grid_skip_what_a_late_tick_overran_and_follow_a_new_period(ros):
    ticks = _Ticks()
    control = _control(ros, ticks)
    try:
        assert until(lambda: len(ticks.ticks) >= 20, timeout=10.0)
        assert control.node is None  # system clock: no companion node
        ticks.slow = 0.035  # 3.5 periods
        assert until(lambda: len(ticks.ticks) >= 40, timeout=10.0)
        control.period_ns = 2 * PERIOD_NS
        n = len(ticks.ticks)
        assert until(lambda: len(ticks.ticks) >= n + 10, timeout=10.0)
    finally:
        control.destroy()
    assert not control.alive and control.stopped
    after_stop = len(ticks.ticks)
    time.sleep(0.05)
    assert len(ticks.ticks) == after_stop  # no tick after stop

    scheduled = [s for s, _ in ticks.ticks]
    steps = [(b - a) / PERIOD_NS for a, b in zip(scheduled, scheduled[1:])]
    assert all((b - a) % PERIOD_NS == 0 for a, b in zip(scheduled, scheduled[1:])), steps  # an exact grid
    assert all(actual >= s - 50_000 for s, actual in ticks.ticks)  # never before its due time
    assert max(round(s) for s in steps) >= 4  # the ticks the slow one overran were skipped ...
    assert min(steps) > 0.99  # ... not run in a burst
    assert [round(s) for s in steps[-5:]].count(2) >= 3  # the new period


class _SetBackOwner:
    """An inference node as the control thread sees it, whose system clock (``set_back_ns``)
    an operator or NTP can step back."""

    def __init__(self):
        import logging

        self.set_back_ns = 0
        self.log = logging.getLogger("test_control_thread")

    def has_parameter(self, name):
        return False  # no use_sim_time: the system clock

    def get_clock(self):
        owner = self

        class Clock:
            def now(self):
                return types.SimpleNamespace(nanoseconds=time.time_ns() - owner.set_back_ns)

        return Clock()


def test_ticks_keep_coming_when_the_system_clock_is_set_back():
    """A system clock stepped back (a minute here) does not stop the robot's actions until the
    clock is back where it was: the grid starts again from the new time and the ticks go on at
    their period (10 more within a generous bound; the ticks' count is asserted, not their time)."""
    from oxygen_ros.ros.control_thread import ControlThread

    owner, ticks = _SetBackOwner(), _Ticks()
    control = ControlThread(owner, PERIOD_NS, ticks, 0, owner.log)
    control.start()
    try:
        assert until(lambda: len(ticks.ticks) >= 5, timeout=10.0)
        owner.set_back_ns = 60 * 1_000_000_000
        n = len(ticks.ticks)
        assert until(lambda: len(ticks.ticks) >= n + 12, timeout=10.0), "the ticks stopped after the clock went back"
    finally:
        control.destroy()
    scheduled = [s for s, _ in ticks.ticks]
    later = scheduled[n + 1:]  # after the one that may have been due when the clock went back
    assert max(later) < scheduled[n - 1]  # on the clock as it reads now
    assert all(b > a and (b - a) % PERIOD_NS == 0 for a, b in zip(later, later[1:]))  # a grid again


@pytest.mark.parametrize("control_process", [False, True], ids=["control-thread", "control-process"])
def test_the_inference_nodes_actions_keep_coming_while_its_executor_is_stuck(ros, control_process):
    prefix = unique_prefix()
    node = inference_node(ros, prefix, hold_action="last", control_rate_hz=50.0, frame_deadline_ms=5000.0,
                          control_process=control_process)
    client = InferenceClient(ros, prefix, node=node)
    assert until(lambda: len(client.chunks) >= 5, every=client.observe, period=0.1)
    if control_process:
        assert node.control_pid is not None and node.control is None
    else:
        assert node.control.alive and node.control.node is None
    stalls = []

    def stall():  # a callback of the node's own executor that keeps it 1 s
        stalls.append(time.monotonic())
        time.sleep(1.0)

    timer = node.create_timer(0.05, stall)
    try:
        assert until(lambda: len(stalls) >= 3, timeout=10.0)
        start = len(client.chunks)
        arrivals = []
        seen = [start]

        def note():
            while seen[0] < len(client.chunks):
                arrivals.append(time.monotonic())
                seen[0] += 1

        until(lambda: len(arrivals) >= 40, timeout=5.0, every=note, period=0.005)
    finally:
        node.destroy_timer(timer)
    assert len(arrivals) >= 40, "the actions stopped while the node's executor was stuck"
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert max(gaps) < 0.4, f"an action gap of {max(gaps) * 1e3:.0f} ms behind a 1 s executor stall"


def test_with_use_sim_time_the_ticks_follow_clock(ros):
    from builtin_interfaces.msg import Time
    from rosgraph_msgs.msg import Clock

    prefix = unique_prefix()
    node = inference_node(ros, prefix, use_sim_time=True, hold_action="last", frame_deadline_ms=5000.0)
    assert node.control.node is not None  # an rclpy timer on the companion node
    pub = ros.node("oxygen_test_clock").create_publisher(Clock, "/clock", reliable(10))
    assert until(lambda: pub.get_subscription_count() >= 2)  # the node's and its control node's clocks
    robot = next(iter(node.robot_io.values()))
    sim_ns = [1_000_000_000]

    def advance(step_ns: int = 5_000_000):
        sim_ns[0] += step_ns
        pub.publish(Clock(clock=Time(sec=sim_ns[0] // 1_000_000_000, nanosec=sim_ns[0] % 1_000_000_000)))

    assert until(lambda: robot.output.clock.ticks >= 10, every=advance, period=0.005)
    frozen = robot.output.clock.ticks
    time.sleep(0.3)  # 15 periods of wall time; /clock stands still
    assert robot.output.clock.ticks <= frozen + 1
    start_sim, start = sim_ns[0], robot.output.clock.ticks
    slow = lambda: advance(2_000_000)  # noqa: E731  sim time at 2 ms per 5 ms of wall time
    assert until(lambda: sim_ns[0] - start_sim >= 200_000_000, every=slow, period=0.005)
    time.sleep(0.1)
    # 200 ms of sim time at 50 Hz: 10 ticks (fewer where /clock messages were dropped); the
    # 600 ms of wall time it took would have given 30
    assert 5 <= robot.output.clock.ticks - start <= 11

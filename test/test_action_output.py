"""A robot's action output (oxygen_ros/ros/action_output.py): a message that cannot be
built is counted and logged, never raised into the control tick, and the next one goes out;
the tick grid (each tick's scheduled time, the ticks a late timer missed)."""

import collections

import numpy as np
from ros_harness import reliable, unique_prefix, until

from oxygen_ros.core.chunk_clock import Chunk, Due
from oxygen_ros.core.frame_records import FrameRecords

PARAMS = {"hold_action": "last", "control_frame": "", "joint_names": []}
P = 10_000_000  # a 100 Hz control tick (ns)


def test_a_failed_publication_is_counted_and_the_next_goes_out(ros):
    from oxygen_ros.msg import ActionChunk
    from oxygen_ros.ros.action_output import ActionOutput

    topic = f"{unique_prefix()}/actions"
    node = ros.node("oxygen_test_action_output")
    counters = collections.Counter()
    output = ActionOutput(node, PARAMS, counters, FrameRecords(10), actions_topic=topic, trajectory_topic="")
    got = []
    ros.node("oxygen_test_actions_sub").create_subscription(ActionChunk, topic, got.append, reliable(10))
    assert until(lambda: node.count_subscribers(topic) == 1)
    bad = Chunk(np.zeros((3, 2)), 10_000_000, None, frame_id=-1)  # an ActionChunk's frame_id is unsigned
    output.publish(Due(bad, 0, 0, True))  # must not raise
    assert counters["publish_errors"] == 1 and counters["actions_published"] == 0
    good = Chunk(np.ones((3, 2)), 10_000_000, None, frame_id=4)
    output.publish(Due(good, 1, 10_000_000, True))
    assert until(lambda: len(got) == 1)
    assert got[0].frame_id == 4 and got[0].offset == 1 and counters["actions_published"] == 1


def test_without_a_scheduled_time_each_callback_is_the_tick_rcl_scheduled():
    """Jazzy's rclpy gives no scheduled time: each callback is taken for the tick rcl's timer
    served, a period after the one before however late it comes, so that a late callback never
    pushes the stamps ahead of the grid (rounding its time did: after one callback 0.6 period
    late, every later one was stamped a period ahead, for the rest of the run)."""
    from oxygen_ros.ros.action_output import TickGrid

    counters = collections.Counter()
    grid = TickGrid(counters)
    t0 = 5_000_000_000
    calls = (0, P + 6 * P // 10, 2 * P + P // 10, 3 * P + P // 20, 4 * P + P // 20)
    assert [grid.count(None, t0 + t, P) for t in calls] == [t0 + k * P for k in range(5)]
    assert counters["missed_ticks"] == 0
    # a callback 1.5 periods late: rcl, seeing the tick after it already past, skips it
    assert grid.count(None, t0 + 5 * P + 3 * P // 2, P) == t0 + 5 * P
    assert grid.count(None, t0 + 7 * P, P) == t0 + 7 * P
    assert counters["missed_ticks"] == 1


def test_a_tick_two_periods_after_the_last_counts_the_one_missed():
    from oxygen_ros.ros.action_output import TickGrid

    counters = collections.Counter()
    grid = TickGrid(counters)
    t0 = 5_000_000_000
    for k in (0, 1, 2):  # on time: nothing missed
        assert grid.count(t0 + k * P, t0 + k * P + P // 2, P) == t0 + k * P
    assert counters["missed_ticks"] == 0
    assert grid.count(t0 + 4 * P, t0 + 4 * P, P) == t0 + 4 * P  # rcl skipped the tick at 3 P
    assert counters["missed_ticks"] == 1
    assert grid.count(t0 + 7 * P, t0 + 7 * P, P) == t0 + 7 * P  # and those at 5 P and 6 P
    assert counters["missed_ticks"] == 3

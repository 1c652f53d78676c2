"""A robot's action output (oxygen_ros/ros/action_output.py): a message that cannot be
built is counted and logged, never raised into the control tick, and the next one goes out."""

import collections

import numpy as np
from ros_harness import reliable, unique_prefix, until

from oxygen_ros.core.chunk_clock import Chunk, Due
from oxygen_ros.core.frame_records import FrameRecords

PARAMS = {"hold_action": "last", "control_frame": "", "joint_names": []}


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

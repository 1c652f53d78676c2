"""The BagPlayer on real DDS with a bag of two robots: with lockstep_robots each robot's
images wait for that robot's ActionChunks (/<robot> + action_topic), not the other's.

The policy is a real rclpy node of the test answering every image on its robot's
ActionChunk topic after a delay (or, for one robot, never).
"""

import time

import numpy as np
import pytest
from message_builders import bag_recording
from ros_harness import params, play_once_matched, player_progress

ROBOTS = ("left", "right")


def _two_robot_recording(p, images):
    """Both robots' images (and joint states) interleaved, 1 ms apart: all due at once."""
    out = []
    for index, robot in enumerate(ROBOTS):
        for topic, msg, t in bag_recording(f"/{robot}{p}", images=images, spacing_ns=2_000_000):
            out.append((topic, msg, t + index * 1_000_000))
    return sorted(out, key=lambda r: r[2])


class _Policy:
    """Answers every image of ``robot`` on its ActionChunk topic ``delay`` s later (never: None)."""

    def __init__(self, stepped_ros, p, robot, delay):
        from sensor_msgs.msg import Image

        from oxygen_ros.msg import ActionChunk

        node = stepped_ros.node(f"oxygen_test_policy_{robot}")
        self.actions = node.create_publisher(ActionChunk, f"/{robot}{p}/actions", 10)
        self.topic = f"/{robot}{p}/camera/image_raw"
        self.delay, self.seen, self.answers, self.due = delay, [], [], []
        node.create_subscription(Image, self.topic, self._on_image, 10)

    def _on_image(self, msg):
        self.seen.append(time.monotonic())
        if self.delay is not None:
            self.due.append(time.monotonic() + self.delay)

    def respond(self):
        from oxygen_ros.ros.conversions import action_chunk_msg

        while self.due and time.monotonic() >= self.due[0]:
            self.due.pop(0)
            n = len(self.answers)
            self.actions.publish(action_chunk_msg(0.0, n, n, 0.0, 0, 0.1, np.zeros((2, 2))))
            self.answers.append(time.monotonic())


@pytest.mark.parametrize("right_delay", [0.25, None], ids=["both_answer", "right_silent"])
def test_each_robot_waits_for_its_own_action_chunks(stepped_ros, tmp_path, right_delay):
    from oxygen_ros.ros.bag_player import BagPlayer
    from oxygen_ros.ros.bags import write_bag

    p, n, left_delay, timeout = stepped_ros.prefix, 4, 0.1, 0.6
    bag = write_bag(tmp_path / "bag", "mcap", _two_robot_recording(p, n))
    policies = {"left": _Policy(stepped_ros, p, "left", left_delay), "right": _Policy(stepped_ros, p, "right", right_delay)}
    player = stepped_ros.add(BagPlayer(context=stepped_ros.context, parameter_overrides=params(
        bag_path=str(bag), lockstep=True, lockstep_robots=list(ROBOTS), action_topic=f"{p}/actions",
        lockstep_timeout_s=timeout, start_delay_s=5.0)))
    gates = player.lockstep_gates
    assert {k: g.action_topic for k, g in gates.items()} == {
        "": f"{p}/actions", "left": f"/left{p}/actions", "right": f"/right{p}/actions"}
    assert stepped_ros.spin_until(lambda: all(player.publishers_by_topic[x.topic].get_subscription_count() >= 1
                                              and x.actions.get_subscription_count() >= 1 for x in policies.values()))
    # every image's gate has its policy: nothing to wait for on the ActionChunk side. The gate on
    # {p}/actions holds no image, and nothing publishes there (it held the start back for
    # wait_for_subscribers_s, and warned of it)
    assert stepped_ros.spin_until(lambda: not [t for t in player.unmatched_topics() if t.endswith("/actions")]), \
        player.unmatched_topics()
    player.start_now()

    def respond():
        for policy in policies.values():
            policy.respond()

    assert stepped_ros.spin_until(lambda: player.finished and all(len(x.seen) == n for x in policies.values()),
                                  timeout=20.0, every=respond, period=0.005)
    left, right = policies["left"], policies["right"]
    for k in range(1, n):  # left image k went out only after left's answer to image k-1
        assert left.seen[k] >= left.answers[k - 1], (left.seen, left.answers)
    assert gates["left"].timeouts == 0 and gates[""].timeouts == 0
    if right_delay is not None:
        assert player.lockstep_timeouts == 0
        for k in range(1, n):
            assert right.seen[k] >= right.answers[k - 1], (right.seen, right.answers)
        assert gates["left"].action_seq >= n - 2 and gates["right"].action_seq >= n - 2
    else:
        # right's images timed out one after the other; left's gate never waited for right
        assert gates["right"].timeouts == n - 1 == player.lockstep_timeouts
        assert min(np.diff(right.seen)) >= timeout * 0.9


def test_lockstep_robots_are_checked(stepped_ros, tmp_path):
    from oxygen_ros.ros.bag_player import BagPlayer
    from oxygen_ros.ros.bags import write_bag
    from oxygen_ros.ros.parameters import ParameterError

    bag = write_bag(tmp_path / "bag", "mcap", bag_recording(images=1))
    with pytest.raises(ParameterError, match="'lockstep_robots'.*'2nd'"):
        BagPlayer(context=stepped_ros.context, parameter_overrides=params(bag_path=str(bag),
                                                                          lockstep_robots=["left", "2nd"]))
    with pytest.raises(ParameterError, match="'action_topic'.*absolute"):
        BagPlayer(context=stepped_ros.context, parameter_overrides=params(
            bag_path=str(bag), lockstep_robots=["left"], action_topic="oxygen/actions"))


def test_a_two_robot_bag_replays_in_lockstep_through_camera_nodes_and_one_inference_node(ros_env, tmp_path):
    """The whole pipeline, real nodes: bag player (lockstep_robots) -> a camera node per robot in
    its namespace -> one inference node serving both -> each robot's ActionChunks release that
    robot's next image; every image of both robots is grouped, nothing times out."""
    from std_msgs.msg import String

    from oxygen_ros.msg import ActionChunk
    from oxygen_ros.ros.bag_player import BagPlayer
    from oxygen_ros.ros.bags import write_bag
    from oxygen_ros.ros.camera_node import CameraNode
    from oxygen_ros.ros.conversions import rgb_to_image_msg
    from oxygen_ros.ros.inference_node import InferenceNode
    from ros_harness import Ros, reliable, unique_prefix

    p, frames, t0 = unique_prefix(), 5, 1_700_000_000 * 10**9
    messages, rng = [], np.random.default_rng(3)
    for index, robot in enumerate(ROBOTS):
        messages.append((f"/{robot}{p}/instruction", String(data=f"{robot}: pick up the cube"), t0 + index))
        for i in range(frames):
            stamp = t0 + (i + 1) * 100_000_000 + index * 1_000_000
            image = rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)
            messages.append((f"/{robot}{p}/camera/image_raw", rgb_to_image_msg(image, "rgb8", stamp * 1e-9, "cam"),
                             stamp))
    bag = write_bag(tmp_path / "bag", "mcap", sorted(messages, key=lambda m: m[2]),
                    latched_topics=[f"/{r}{p}/instruction" for r in ROBOTS])
    with Ros() as ros:
        seen = {r: set() for r in ROBOTS}
        listener = ros.node("oxygen_test_two_robot_actions")
        for robot in ROBOTS:
            listener.create_subscription(ActionChunk, f"/{robot}{p}/actions",
                                         lambda m, r=robot: seen[r].add(int(m.observation_seq)), reliable(100))
        inference = ros.add(InferenceNode(context=ros.context, parameter_overrides=params(
            preset="tiny", model_path="", robots=list(ROBOTS), chunk_origin="frame_end", max_observation_age=0.0,
            observation_topic=f"{p}/observation", actions_topic=f"{p}/actions", text_topic=f"{p}/text",
            question_topic=f"{p}/question", trajectory_topic=f"{p}/trajectory", ask_action=f"{p}/ask")))
        cameras = {r: ros.add(CameraNode(context=ros.context, namespace=r, parameter_overrides=params(
            image_topics=[f"/{r}{p}/camera/image_raw"], instruction_topic=f"/{r}{p}/instruction",
            observation_topic=f"/{r}{p}/observation", image_size=32, max_age=10.0))) for r in ROBOTS}
        player = ros.add(BagPlayer(context=ros.context, parameter_overrides=params(
            bag_path=str(bag), lockstep=True, lockstep_robots=list(ROBOTS), action_topic=f"{p}/actions",
            rate=4.0, start_delay_s=60.0)))
        play_once_matched(ros, player, inference, ROBOTS)
        assert inference.robot_names == ROBOTS
        assert ros.wait_until(player.done.done, 60.0), player_progress(ros, player)
        assert player.lockstep_timeouts == 0, "lockstep broke: a robot's ActionChunk did not come"
        for robot in ROBOTS:
            assert ros.wait_until(lambda r=robot: frames - 1 in seen[r], 20.0), (robot, seen[robot])
            assert cameras[robot].published == frames, robot
            assert player.lockstep_gates[robot].action_seq >= frames - 2

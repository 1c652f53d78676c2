"""The camera node's image QoS, received rates and names, on real DDS.

* ``image_reliability: reliable`` gets every 1080p raw frame of a reliable publisher;
* one camera's subscription can differ through ROS 2's ``qos_overrides`` parameters;
* a camera below ``min_camera_rate_hz`` is warned about on the console (with its
  remapped topic name and a hint when a reliable publisher meets a best-effort
  subscription, or when nothing publishes on its topic) and in ``/diagnostics``
  (its received rate);
* a publisher whose QoS cannot match is named in a warning.

Counts and log lines are checked, never durations.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from ros_harness import Ros, params, reliable, unique_prefix, until


class Rig:
    """A camera node on topics of its own, a test node publishing its images and
    recording its /rosout lines, /diagnostics and Observations."""

    def __init__(self, ros: Ros, image_topic_publisher_qos, overrides: dict, cli: list[str] | None = None,
                 published_topic: str | None = None):
        from diagnostic_msgs.msg import DiagnosticArray
        from rcl_interfaces.msg import Log
        from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
        from sensor_msgs.msg import Image

        from oxygen_ros.msg import Observation
        from oxygen_ros.ros.camera_node import CameraNode

        self.prefix = p = unique_prefix()
        values = {"image_topics": [f"{p}/raw"], "compressed_image_topics": [], "instruction_topic": f"{p}/instruction",
                  "observation_topic": f"{p}/observation", "image_size": 16, "max_age": 10.0, **overrides}
        self.node = ros.node("oxygen_test_qos_rig")
        self.logs, self.diagnostics, self.observations = [], [], []
        self.node.create_subscription(Log, "/rosout", self._on_log, QoSProfile(
            depth=1000, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL))
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, reliable(50))
        self.node.create_subscription(Observation, f"{p}/observation", self.observations.append, reliable(100))
        self.camera = ros.add(CameraNode(context=ros.context, namespace=p, parameter_overrides=params(**values),
                                         cli_args=["--ros-args", *(c.format(p=p) for c in cli or [])]))
        topic = published_topic.format(p=p) if published_topic else f"{p}/raw"
        self.pub = self.node.create_publisher(Image, topic, image_topic_publisher_qos)

    def _on_log(self, msg) -> None:
        if msg.name.endswith("oxygen_camera") and self.prefix in msg.msg or self.prefix[1:] in msg.name:
            self.logs.append(msg.msg)

    def _on_diag(self, msg) -> None:
        self.diagnostics += [s for s in msg.status
                             if s.name.endswith("oxygen_camera: cameras") and self.prefix in s.hardware_id]

    def last_figures(self) -> dict:
        return {kv.key: kv.value for kv in self.diagnostics[-1].values} if self.diagnostics else {}

    def image(self, rgb: np.ndarray):
        from oxygen_ros.ros.conversions import ns_to_time_msg, rgb_to_image_msg

        return rgb_to_image_msg(rgb, "rgb8", ns_to_time_msg(self.node.get_clock().now().nanoseconds), "cam")


def _data_qos(reliability: str, depth: int = 10):
    from oxygen_ros.ros.qos import image_qos

    return image_qos(reliability, depth)


def test_a_reliable_subscription_gets_every_large_raw_image(ros_env):
    """40 frames of 1080p rgb8 (6.2 MB each) at 10 Hz from a reliable publisher: all 40 arrive
    and are grouped (a best-effort subscription loses most of them: see the README)."""
    with Ros() as ros:
        rig = Rig(ros, _data_qos("reliable"), {"image_reliability": "reliable", "image_qos_depth": 10})
        assert until(lambda: rig.pub.get_subscription_count() >= 1, 20.0), "not matched"
        frame = np.random.default_rng(0).integers(0, 255, (1080, 1920, 3), dtype=np.uint8)
        for i in range(40):
            frame[0, 0, 0] = i
            rig.pub.publish(rig.image(frame))
            time.sleep(0.1)
        assert until(lambda: rig.camera.received[0] >= 40, 60.0), f"received {rig.camera.received[0]} of 40"
        assert until(lambda: len(rig.observations) >= 40, 30.0)
        assert rig.camera.received[0] == 40 and rig.camera.published == 40
        assert sum(rig.camera.rejected.values()) == 0


def test_one_camera_is_made_reliable_through_qos_overrides(ros_env, tmp_path):
    """image_reliability / image_qos_depth set every camera; ROS 2's qos_overrides.<topic>
    parameters set one: the graph shows each subscription's reliability, the start-up
    line each one's reliability and depth (DDS discovery does not carry the depth)."""
    import yaml
    from rclpy.qos import ReliabilityPolicy

    with Ros() as ros:
        p = unique_prefix()
        file = tmp_path / "camera.yaml"
        file.write_text(yaml.safe_dump({"/**": {"ros__parameters": {
            "qos_overrides": {f"{p}/right": {"subscription": {"reliability": "reliable", "depth": 2}}}}}}))
        rig = Rig(ros, _data_qos("reliable"), {"image_topics": [f"{p}/left", f"{p}/right"], "image_qos_depth": 7},
                  cli=["--params-file", str(file)])
        assert until(lambda: any(f"base={p}/left (best effort, depth 7), cam1={p}/right (reliable, depth 2)" in line
                                 for line in rig.logs), 10.0), rig.logs
        probe = rig.node

        def subscription(topic):
            infos = [i for i in probe.get_subscriptions_info_by_topic(topic) if i.node_name == "oxygen_camera"]
            return infos[0].qos_profile if infos else None

        assert until(lambda: subscription(f"{p}/left") and subscription(f"{p}/right"), 20.0)
        left, right = subscription(f"{p}/left"), subscription(f"{p}/right")
        assert left.reliability == ReliabilityPolicy.BEST_EFFORT
        assert right.reliability == ReliabilityPolicy.RELIABLE


def test_a_camera_with_no_image_yet_gets_the_qos_hint_as_a_possibility(ros_env):
    """A reliable publisher that sent nothing yet (a bag player waiting for its subscribers) and
    a best-effort subscription: the hint says what would lose every image, not that it does."""
    with Ros() as ros:
        rig = Rig(ros, _data_qos("reliable"), {"min_camera_rate_hz": 5.0})
        assert until(lambda: rig.pub.get_subscription_count() >= 1, 20.0)

        def warned():
            return [line for line in rig.logs if "below min_camera_rate_hz 5" in line]

        assert until(warned, 30.0), rig.logs
        assert "if it sends large raw images, best effort can lose every one: set image_reliability: reliable" \
            in warned()[0], warned()[0]


def test_a_camera_whose_topic_nobody_publishes_is_said_to_have_no_publisher(ros_env):
    """The camera publishes on another topic than the node's (a typo, a namespace): the rate
    warning says that nothing publishes there, not a QoS possibility."""
    with Ros() as ros:
        rig = Rig(ros, _data_qos("reliable"), {"min_camera_rate_hz": 5.0}, published_topic="{p}/camera/raw")

        def warned():
            return [line for line in rig.logs if "below min_camera_rate_hz 5" in line]

        assert until(warned, 30.0), rig.logs
        assert f"nothing publishes on {rig.prefix}/raw: check the topic's name" in warned()[0], warned()[0]
        assert "image_reliability" not in warned()[0]


@pytest.mark.parametrize("side, hinted", [(160, True), (8, False)], ids=["large images", "small images"])
def test_a_slow_camera_is_warned_about_by_its_remapped_name(ros_env, side, hinted):
    """A 2 Hz camera under min_camera_rate_hz 5, remapped to another topic: the console says so,
    naming the remapped topic and hinting at a reliable subscription when its publisher is
    reliable and its images come in fragments (160 x 160 RGB, 77 KB; an 8 x 8 one fits one
    datagram: QoS is not why it is slow), and /diagnostics carries the camera's received
    rate and WARN."""
    with Ros() as ros:
        rig = Rig(ros, _data_qos("reliable"), {"min_camera_rate_hz": 5.0},
                  cli=["-r", "{p}/raw:={p}/robot/color/image_raw"], published_topic="{p}/robot/color/image_raw")
        remapped = f"{rig.prefix}/robot/color/image_raw"
        assert until(lambda: rig.pub.get_subscription_count() >= 1, 20.0), "not matched on the remapped topic"
        frame = np.zeros((side, side, 3), np.uint8)

        def warned():
            return [line for line in rig.logs if "below min_camera_rate_hz 5" in line]

        assert until(warned, 30.0, every=lambda: (rig.pub.publish(rig.image(frame)), time.sleep(0.5))), rig.logs
        line = warned()[0]
        assert f"camera base on {remapped}:" in line and "frames/s received over the last 3 s" in line
        assert ("image_reliability: reliable" in line) == hinted  # a reliable publisher, a best-effort subscription
        assert any(f"base={remapped} (best effort, depth 5)" in line for line in rig.logs), rig.logs  # start-up
        assert until(lambda: "below min_camera_rate_hz" in (rig.diagnostics[-1].message if rig.diagnostics else ""),
                     10.0, every=lambda: (rig.pub.publish(rig.image(frame)), time.sleep(0.5)))
        figures = rig.last_figures()
        assert figures["base.topic"] == remapped
        assert 0.5 <= float(figures["base.rate_hz"]) <= 3.5, figures["base.rate_hz"]


def test_a_publisher_that_cannot_match_is_named(ros_env):
    """A reliable subscription never receives from a best-effort publisher: the camera node
    says which topic and which policy, instead of staying silent."""
    with Ros() as ros:
        rig = Rig(ros, _data_qos("best_effort"), {"image_reliability": "reliable", "min_camera_rate_hz": 0.0})
        lines = lambda: [line for line in rig.logs if "incompatible (reliability)" in line]  # noqa: E731
        assert until(lines, 20.0), rig.logs
        assert f"a publisher on {rig.prefix}/raw cannot reach this node" in lines()[0]
        assert rig.camera.received[0] == 0

"""A test node for the camera node's tests: it publishes camera frames (a raw and a
compressed camera), the instruction (latched) and optionally joint states on the
``stepped_ros`` prefix's topics, and collects the Observations."""

import numpy as np


class CameraRig:
    """A test node publishing camera frames and collecting Observations."""

    def __init__(self, stepped_ros, state=False):
        from oxygen_ros.msg import Observation
        from rclpy.qos import qos_profile_sensor_data
        from sensor_msgs.msg import CompressedImage, Image, JointState
        from std_msgs.msg import String

        from oxygen_ros.ros.qos import LATCHED_QOS, OBSERVATION_QOS

        p = stepped_ros.prefix
        self.stepped_ros = stepped_ros
        self.node = stepped_ros.node("oxygen_test_rig")
        self.raw = self.node.create_publisher(Image, f"{p}/cam_raw", qos_profile_sensor_data)
        self.jpeg = self.node.create_publisher(CompressedImage, f"{p}/cam_jpeg", qos_profile_sensor_data)
        self.instruction = self.node.create_publisher(String, f"{p}/instruction", LATCHED_QOS)
        self.state = self.node.create_publisher(JointState, f"{p}/joint_states", 10) if state else None
        self.observations = []
        self.node.create_subscription(Observation, f"{p}/observation", self.observations.append, OBSERVATION_QOS)

    def now(self, offset=0.0):
        from oxygen_ros.ros.conversions import ns_to_time_msg

        return ns_to_time_msg(self.node.get_clock().now().nanoseconds + round(offset * 1e9))

    def send_raw(self, rgb, age=0.0, **kw):
        from oxygen_ros.ros.conversions import rgb_to_image_msg

        msg = kw.pop("msg", None) or rgb_to_image_msg(rgb, kw.pop("encoding", "rgb8"), self.now(-age), "raw_frame")
        self.raw.publish(msg)
        return msg

    def send_jpeg(self, rgb, age=0.0, fmt="jpeg"):
        from oxygen_ros.ros.conversions import rgb_to_compressed_msg

        msg = rgb_to_compressed_msg(rgb, fmt, self.now(-age), "jpeg_frame")
        self.jpeg.publish(msg)
        return msg

    def wait_matched(self, camera_node, timeout=10.0):
        """Until the camera node's subscriptions see our publishers (so nothing is lost)."""
        pubs = [self.raw, self.jpeg] + ([self.state] if self.state else [])
        assert self.stepped_ros.spin_until(lambda: all(p.get_subscription_count() >= 1 for p in pubs), timeout)
        assert self.stepped_ros.spin_until(
            lambda: camera_node.count_subscribers(f"{self.stepped_ros.prefix}/observation") >= 1, timeout)


def solid(h, w, colour):
    return np.tile(np.array(colour, np.uint8), (h, w, 1))


def record_log(node, monkeypatch) -> list[tuple[str, str]]:
    """The (level, text) of the info and warning lines ``node`` logs from now on (other
    levels go to its logger as before)."""
    lines = []
    logger = node.get_logger()

    class Recorder:
        def info(self, text, **kw):
            lines.append(("info", text))

        def warning(self, text, **kw):
            lines.append(("warning", text))

        def __getattr__(self, name):
            return getattr(logger, name)

    monkeypatch.setattr(node, "get_logger", Recorder)
    return lines

"""The camera node's inputs: whatever arrives on its image, state and instruction topics,
it keeps running, says what was wrong (counters, throttled log lines, /diagnostics) and
publishes only valid Observations.

Real nodes on real DDS (private contexts, topics of their own); counts and message
contents are checked, never durations.
"""

import functools
import math
import time

import numpy as np
import ros_harness
from message_builders import (
    INVALID_UTF8,
    cdr_with,
    compressed_image,
    jpeg_with_scan_changed,
    png_file,
    png_with_idat_changed,
    png_with_size,
    raw_image,
)
from ros_harness import params, reliable, unique_prefix

from oxygen_ros.ros.conversions import IMAGE_ERROR_REASONS

until = functools.partial(ros_harness.until, timeout=20.0)  # best-effort topics: publish meanwhile
_raw = functools.partial(raw_image, width=4)
_compressed = functools.partial(compressed_image, fmt="jpeg")


class CameraRig:
    """A camera node on its own topics and a test node feeding it and recording its outputs
    (observations, /diagnostics of this camera node, its /rosout lines)."""

    def __init__(self, ros, **overrides):
        from diagnostic_msgs.msg import DiagnosticArray
        from oxygen_ros.msg import Observation
        from rcl_interfaces.msg import Log
        from rclpy.qos import (
            DurabilityPolicy,
            QoSProfile,
            ReliabilityPolicy,
            qos_profile_sensor_data,
        )
        from sensor_msgs.msg import CompressedImage, Image, JointState
        from std_msgs.msg import String

        from oxygen_ros.ros.camera_node import CameraNode
        from oxygen_ros.ros.qos import LATCHED_QOS, OBSERVATION_QOS

        p = self.prefix = unique_prefix()
        self.ros = ros
        defaults = dict(image_topics=[f"{p}/raw"], compressed_image_topics=[f"{p}/jpeg"],
                        instruction_topic=f"{p}/instruction", observation_topic=f"{p}/observation",
                        state_topic=f"{p}/joint_states", image_size=16, max_age=5.0, max_image_bytes=10_000,
                        default_instruction="fallback")
        defaults.update(overrides)
        self.node = ros.node("oxygen_test_camera_rig")
        self.observations, self.diagnostics, self.logs = [], [], []
        self.node.create_subscription(Observation, f"{p}/observation", self.observations.append, OBSERVATION_QOS)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, reliable(50))
        self.node.create_subscription(Log, "/rosout", self._on_log, QoSProfile(
            depth=1000, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL))
        self.raw = self.node.create_publisher(Image, f"{p}/raw", qos_profile_sensor_data)
        self.jpeg = self.node.create_publisher(CompressedImage, f"{p}/jpeg", qos_profile_sensor_data)
        self.state = self.node.create_publisher(JointState, f"{p}/joint_states", qos_profile_sensor_data)
        self.instruction = self.node.create_publisher(String, f"{p}/instruction", LATCHED_QOS)
        self.camera = ros.add(CameraNode(context=ros.context, parameter_overrides=params(**defaults)))
        read = set(self.camera.topics) | {defaults["instruction_topic"], defaults["state_topic"]}
        assert until(lambda: all(pub.get_subscription_count() >= 1 for pub in (self.raw, self.jpeg, self.state,
                                                                                self.instruction)
                                 if pub.topic_name in read))

    def _on_diag(self, msg):
        for status in msg.status:
            if status.name.endswith("oxygen_camera: cameras") and self.prefix in status.hardware_id:
                self.diagnostics.append(status)

    def _on_log(self, msg):
        if self.prefix in msg.msg:
            self.logs.append(msg)

    def now(self):
        from oxygen_ros.ros.conversions import ns_to_time_msg

        return ns_to_time_msg(self.node.get_clock().now().nanoseconds)

    def send_good(self, state=(0.25, -0.5)):
        from sensor_msgs.msg import JointState

        from oxygen_ros.ros.conversions import rgb_to_compressed_msg, rgb_to_image_msg

        rgb = np.full((8, 8, 3), 77, np.uint8)
        self.state.publish(JointState(name=["a", "b"][:len(state)], position=list(state)))
        self.raw.publish(rgb_to_image_msg(rgb, "bgr8", self.now()))
        self.jpeg.publish(rgb_to_compressed_msg(rgb, "png", self.now()))


def _bad_images():
    """(publisher attribute, message, reason): every way an image can be refused."""
    from oxygen_ros.ros.conversions import rgb_to_compressed_msg, rgb_to_image_msg

    smooth = np.tile(np.arange(32, dtype=np.uint8)[:, None, None] * 7, (1, 32, 3))
    jpeg = bytes(rgb_to_compressed_msg(smooth, "jpeg").data)
    return [
        ("raw", _raw("yuv422"), "unsupported_encoding"),
        ("raw", _raw("32FC1"), "unsupported_encoding"),
        ("raw", _raw(height=0, data=b""), "zero_size"),
        ("raw", _raw(data=b""), "empty_data"),
        ("raw", _raw(height=100_000, width=100_000, data=bytes(30)), "too_large"),  # claims to be huge
        ("raw", rgb_to_image_msg(np.zeros((64, 64, 3), np.uint8)), "too_large"),  # 12288 B > max_image_bytes
        ("raw", _raw(step=5), "bad_step"),
        ("raw", _raw(data=bytes(47)), "size_mismatch"),
        ("jpeg", _compressed(b""), "empty_data"),
        ("jpeg", _compressed(b"GIF89a" + bytes(40)), "unsupported_format"),
        ("jpeg", _compressed(jpeg[:200]), "corrupt_compressed"),  # header fine, scan cut short
        ("jpeg", _compressed(b"\xff\xd8\xff\xe0\x00\x10" + bytes(100)), "corrupt_compressed"),
        ("jpeg", _compressed(png_with_size(0, 8)), "zero_size"),
        ("jpeg", _compressed(png_with_size(5000, 5000)), "too_large"),  # refused before decoding
        ("jpeg", _compressed(jpeg_with_scan_changed(jpeg)), "damaged"),  # bytes changed inside the scan
        ("jpeg", _compressed(png_with_idat_changed(png_file(smooth))), "damaged"),  # IDAT CRC mismatch
    ]


def test_camera_node_rejects_every_bad_image_logs_counts_and_uses_the_next_good_frame(ros):
    rig = CameraRig(ros)
    camera = rig.camera
    assert until(rig.observations.__len__, every=rig.send_good), "no observation from good frames"

    cases = _bad_images()
    expected = {}
    for attr, msg, reason in cases:
        expected[reason] = expected.get(reason, 0) + 1
        before = camera.rejected[reason]
        pub = getattr(rig, attr)
        assert until(lambda: camera.rejected[reason] > before, every=lambda: pub.publish(msg)), reason
    assert {r for r, n in camera.rejected.items() if n} == set(expected)
    assert set(expected) >= set(IMAGE_ERROR_REASONS) - {"conversion_failed"}  # every reachable reason

    # the node keeps going: a bad frame in between good ones does not stop the stream
    count = len(rig.observations)
    for _ in range(5):
        rig.raw.publish(_raw("yuv422"))
        rig.send_good()
        time.sleep(0.02)
    assert until(lambda: len(rig.observations) > count, every=rig.send_good)
    img = rig.observations[-1].images[0]
    assert np.frombuffer(img.data, np.uint8).reshape(16, 16, 3)[8, 8].tolist() == [77, 77, 77]

    # one throttled log line per topic and reason, naming both; a burst is not logged line by line
    burst_before = camera.rejected["unsupported_encoding"]
    assert until(lambda: camera.rejected["unsupported_encoding"] >= burst_before + 20,
                 every=lambda: rig.raw.publish(_raw("yuv422")), period=0.01)
    raw_topic, jpeg_topic = camera.topics
    assert until(lambda: all(any(t in m.msg and r.replace("_", " ") in m.msg for m in rig.logs)
                             for a, _, r in cases for t in [raw_topic if a == "raw" else jpeg_topic]))
    yuv_lines = [m for m in rig.logs if raw_topic in m.msg and "unsupported encoding" in m.msg]
    assert len(yuv_lines) < camera.rejected["unsupported_encoding"] / 2, (len(yuv_lines), camera.rejected)

    # /diagnostics once a second: every counter, WARN while images are rejected
    def last_diagnostics():
        return {kv.key: kv.value for kv in rig.diagnostics[-1].values} if rig.diagnostics else {}

    assert until(lambda: all(last_diagnostics().get(f"rejected_{reason}") == str(count)
                             for reason, count in dict(camera.rejected).items()), timeout=15.0)
    last = last_diagnostics()
    assert int(last["rejected_total"]) >= sum(expected.values())
    assert int(last["base.frames"]) >= 1 and int(last["published"]) >= 1
    warned = [s for s in rig.diagnostics if s.level == b"\x01" and "rejected:" in s.message]
    assert warned and any("unsupported_encoding" in s.message for s in warned)
    # once nothing bad arrives any more, the status goes back to OK
    assert until(lambda: rig.diagnostics and rig.diagnostics[-1].level == b"\x00", timeout=10.0,
                 every=rig.send_good, period=0.1)


def test_camera_node_rejects_bad_states_and_handles_bad_instructions(ros):
    from sensor_msgs.msg import JointState
    from std_msgs.msg import String

    from oxygen_ros.ros.conversions import rgb_to_compressed_msg, rgb_to_image_msg

    rig = CameraRig(ros)
    camera = rig.camera
    rgb = np.full((8, 8, 3), 9, np.uint8)

    def images():
        rig.raw.publish(rgb_to_image_msg(rgb, "rgb8", rig.now()))
        rig.jpeg.publish(rgb_to_compressed_msg(rgb, "png", rig.now()))

    bad_states = [
        (JointState(name=["a", "b"], position=[0.1, math.nan]), "state_not_finite"),
        (JointState(name=["a", "b"], position=[math.inf, 0.0]), "state_not_finite"),
        (JointState(name=["a"], position=[]), "state_empty"),
        (JointState(position=[0.0] * 40), "state_too_long"),
        (JointState(name=["a", "b", "c"], position=[0.1, 0.2]), "state_names_mismatch"),
    ]
    for msg, reason in bad_states:
        before = camera.rejected[reason]

        def send(msg=msg):
            rig.state.publish(msg)
            images()

        assert until(lambda: camera.rejected[reason] > before, every=send), reason
        assert camera.state is None  # never forwarded, an older state is not reused either
    assert rig.observations == [], "an observation without a valid state was published"

    # instructions: empty -> default_instruction; control characters removed; invalid UTF-8
    # replaced (never a crash); a very long one is forwarded whole (the inference node cuts it)
    rig.instruction.publish(String(data="go\x07 left\n"))
    assert until(lambda: camera.instruction == "go left ")
    rig.instruction.publish(String(data=""))
    assert until(lambda: camera.instruction is None)
    rig.instruction.publish(cdr_with(String(data="pick ABCD cube"), b"ABCD", INVALID_UTF8))
    assert until(lambda: camera.instruction is not None and camera.instruction.startswith("pick "))
    assert "\ufffd" in camera.instruction and camera.instruction.endswith(" cube")
    long_text = "put the red cube on the blue plate " * 300  # 10,500 characters
    rig.instruction.publish(String(data=long_text))
    assert until(lambda: camera.instruction == long_text)
    assert until(lambda: rig.observations and rig.observations[-1].instruction == long_text,
                 every=rig.send_good)
    assert list(rig.observations[-1].state) == [0.25, -0.5]
    rig.instruction.publish(String(data="   "))
    assert until(lambda: rig.observations and rig.observations[-1].instruction == "fallback",
                 every=rig.send_good)
    assert any("empty instruction" in m.msg for m in rig.logs)


def test_camera_node_refuses_a_damaged_compressed_image_and_uses_the_next_good_one(ros):
    """A JPEG damaged inside its data (OpenCV would decode it to a partly grey image) is
    counted and logged, and no Observation comes from it; the good frame after it is used."""
    from oxygen_ros.ros.conversions import rgb_to_compressed_msg

    rig = CameraRig(ros, image_topics=[], state_topic="")
    camera = rig.camera
    y, x = np.mgrid[0:32, 0:40]
    scene = np.stack([x * 6, y * 7, (x + y) * 3], axis=-1).astype(np.uint8)
    damaged = rgb_to_compressed_msg(scene, "jpeg", quality=75)
    damaged.data = jpeg_with_scan_changed(bytes(damaged.data))
    assert until(lambda: camera.rejected["damaged"] >= 1, every=lambda: rig.jpeg.publish(damaged))
    assert camera.published == 0 and camera.received == [0]

    good = np.full((32, 40, 3), 200, np.uint8)
    assert until(lambda: rig.observations, every=lambda: rig.jpeg.publish(
        rgb_to_compressed_msg(good, "jpeg", rig.now())))
    for obs in rig.observations:  # every Observation is the good frame's
        pixels = np.frombuffer(obs.images[0].data, np.uint8).reshape(16, 16, 3)
        assert np.abs(pixels[4:12].astype(int) - 200).max() <= 2, pixels[8, 8]
    topic = camera.topics[0]
    assert until(lambda: any(topic in m.msg and "damaged" in m.msg for m in rig.logs))
    assert until(lambda: any(kv.key == "rejected_damaged" and int(kv.value) >= 1
                             for s in rig.diagnostics for kv in s.values), timeout=15.0)


def test_a_grey_camera_is_told_once_and_goes_to_the_model_as_three_equal_channels(ros):
    """A mono8 camera is a supported input, but a π0.5-style model sees colour: the log says once
    that this camera's images are grey, and each goes in as three equal channels."""
    from sensor_msgs.msg import JointState

    from oxygen_ros.ros.conversions import rgb_to_compressed_msg, rgb_to_image_msg

    rig = CameraRig(ros)

    def send():
        grey = rgb_to_image_msg(np.full((8, 8, 3), 90, np.uint8), "mono8", rig.now())
        assert grey.encoding == "mono8" and len(grey.data) == 64
        rig.state.publish(JointState(name=["a", "b"], position=[0.25, -0.5]))
        rig.raw.publish(grey)
        rig.jpeg.publish(rgb_to_compressed_msg(np.full((8, 8, 3), 77, np.uint8), "png", rig.now()))

    assert until(lambda: len(rig.observations) >= 5, every=send), "no observation from grey frames"
    img = rig.observations[-1].images[0]
    assert np.frombuffer(img.data, np.uint8).reshape(16, 16, 3)[8, 8].tolist() == [90, 90, 90]
    raw_topic, jpeg_topic = rig.camera.topics
    told = [m.msg for m in rig.logs if "mono8 (grey)" in m.msg]
    assert len(told) == 1 and raw_topic in told[0] and "the model gets each as 3 equal channels" in told[0], told
    assert not any("mono8" in m.msg and jpeg_topic in m.msg for m in rig.logs)


def test_a_state_whose_joints_come_in_another_order_goes_out_in_the_first_message_s_order(ros):
    """Without state_joint_names a driver's JointState went into the observation in each message's
    own order: names [y, x] gave the state swapped, silently (a walkthrough). The first message's
    order is now said once and kept; another set of joints is refused, naming both."""
    from sensor_msgs.msg import JointState

    from oxygen_ros.ros.conversions import rgb_to_compressed_msg, rgb_to_image_msg

    rig = CameraRig(ros)
    rgb = np.full((8, 8, 3), 9, np.uint8)

    def send(names, positions):
        rig.state.publish(JointState(name=names, position=positions))
        rig.raw.publish(rgb_to_image_msg(rgb, "rgb8", rig.now()))
        rig.jpeg.publish(rgb_to_compressed_msg(rgb, "png", rig.now()))

    assert until(lambda: rig.observations, every=lambda: send(["x", "y"], [0.25, -0.5]))
    seen = len(rig.observations)
    assert until(lambda: len(rig.observations) > seen + 2, every=lambda: send(["y", "x"], [-0.75, 0.5]))
    np.testing.assert_allclose(list(rig.observations[-1].state), [0.5, -0.75])
    told = [m.msg for m in rig.logs if "in the first message's order" in m.msg]
    assert told == [f"state from {rig.camera.state_topic}: joints ['x', 'y'], in the first message's order, kept for "
                    "every message (state_joint_names picks them by name)"], told
    before = rig.camera.rejected["state_names_changed"]
    assert until(lambda: rig.camera.rejected["state_names_changed"] > before,
                 every=lambda: send(["x", "z"], [0.1, 0.2]))
    assert until(lambda: any("JointState names ['x', 'z'], not the joints of the first message ['x', 'y']" in m.msg
                             for m in rig.logs))

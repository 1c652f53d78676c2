"""Tests of the camera node (and the synthetic camera feeding it) on real DDS.

Every test runs its nodes in a private rclpy context on the domain of the run
(`make test` sets ROS_DOMAIN_ID, ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST and
ROS_LOG_DIR; the `ros` fixture sets them when missing) and on topic names of
its own, so that runs and tests never hear each other.
"""

import math

import numpy as np
import pytest
from ros_harness import SteppedRos, ros_environment


@pytest.fixture
def ros(tmp_path, monkeypatch):
    """A private, initialised rclpy context with an executor the test spins; nodes added with ros.add()."""
    ros_environment(monkeypatch, tmp_path)
    with SteppedRos() as r:
        yield r


def _params(**values):
    from rclpy.parameter import Parameter

    return [Parameter(k, value=v) for k, v in values.items()]


def _camera(ros, **values):
    from oxygen_ros.ros.camera_node import CameraNode

    p = ros.prefix
    defaults = {
        "image_topics": [f"{p}/cam_raw"],
        "compressed_image_topics": [f"{p}/cam_jpeg"],
        "instruction_topic": f"{p}/instruction",
        "observation_topic": f"{p}/observation",
        "image_size": 32,
        "max_age": 5.0,
    }
    defaults.update(values)
    return ros.add(CameraNode(context=ros.context, parameter_overrides=_params(**defaults)))


class _Rig:
    """A test node publishing camera frames and collecting Observations."""

    def __init__(self, ros, state=False):
        from oxygen_ros.msg import Observation
        from rclpy.qos import qos_profile_sensor_data
        from sensor_msgs.msg import CompressedImage, Image, JointState
        from std_msgs.msg import String

        from oxygen_ros.ros.qos import LATCHED_QOS, OBSERVATION_QOS

        p = ros.prefix
        self.ros = ros
        self.node = ros.node("oxygen_test_rig")
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
        assert self.ros.spin_until(lambda: all(p.get_subscription_count() >= 1 for p in pubs), timeout)
        assert self.ros.spin_until(
            lambda: camera_node.count_subscribers(f"{self.ros.prefix}/observation") >= 1, timeout)


def _solid(h, w, colour):
    return np.tile(np.array(colour, np.uint8), (h, w, 1))


def test_groups_cameras_into_observations_with_latched_instruction(ros):
    from std_msgs.msg import String

    from oxygen_ros.ros.conversions import msg_to_observation, stamp_to_ns

    rig = _Rig(ros)
    rig.instruction.publish(String(data="move to the red circle"))  # latched, before the node exists
    camera = _camera(ros)
    assert camera.camera_names == ["base", "cam1"]
    rig.wait_matched(camera)
    # the latched instruction arrives by itself (frames before it would carry default_instruction)
    assert ros.spin_until(lambda: camera.instruction == "move to the red circle")

    red, green = _solid(48, 64, (200, 30, 30)), _solid(30, 40, (30, 180, 60))
    sent = {}

    def send_both():
        sent["raw"] = rig.send_raw(red, age=0.2)  # the older one: its stamp heads the group
        sent["jpeg"] = rig.send_jpeg(green)

    assert ros.spin_until(lambda: rig.observations, every=send_both), "no Observation received"
    msg = rig.observations[-1]
    assert list(msg.camera_names) == ["base", "cam1"]
    assert msg.instruction == "move to the red circle"
    assert len(msg.state) == 0
    assert [(i.encoding, i.height, i.width) for i in msg.images] == [("rgb8", 32, 32)] * 2
    assert msg.images[0].header.frame_id == "raw_frame" and msg.images[1].header.frame_id == "jpeg_frame"
    stamps = [stamp_to_ns(i.header.stamp) for i in msg.images]
    assert stamp_to_ns(msg.header.stamp) == min(stamps) == stamps[0]

    obs = msg_to_observation(msg)
    base, cam1 = obs.images["base"], obs.images["cam1"]
    assert (base[:4] == 0).all() and (base[-4:] == 0).all()  # 48x64 -> 24x32 band, padded top and bottom
    assert np.array_equal(base[16, 16], [200, 30, 30])
    assert (cam1[:4] == 0).all() and np.abs(cam1[16, 16].astype(int) - [30, 180, 60]).max() <= 6  # JPEG

    # A new group needs a new frame from *every* camera; a re-sent frame
    # (same stamp as the one already grouped) is not new.
    ros.spin_for(0.3)  # send_both may have run more than once: let its later groups arrive first
    before = len(rig.observations)
    for _ in range(5):
        rig.send_raw(red)
        rig.jpeg.publish(sent["jpeg"])
        ros.spin_for(0.05)
    ros.spin_for(0.3)
    assert len(rig.observations) == before
    rig.send_jpeg(green)
    assert ros.spin_until(lambda: len(rig.observations) > before)
    seqs = [m.seq for m in rig.observations]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
    assert camera.published == len(rig.observations)


def test_stale_groups_are_dropped(ros):
    rig = _Rig(ros)
    camera = _camera(ros, max_age=0.5, default_instruction="wait")
    rig.wait_matched(camera)
    frame = _solid(8, 8, (1, 2, 3))

    def send_old():
        rig.send_raw(frame, age=30.0)
        rig.send_jpeg(frame, fmt="png")

    assert ros.spin_until(lambda: camera.dropped_stale >= 3, every=send_old)
    assert rig.observations == []

    def send_fresh():
        rig.send_raw(frame)
        rig.send_jpeg(frame, fmt="png")

    assert ros.spin_until(lambda: rig.observations, every=send_fresh)
    assert rig.observations[0].instruction == "wait"  # no instruction published: the default


def test_bad_images_counted_and_next_good_frame_used(ros):
    from sensor_msgs.msg import CompressedImage, Image

    rig = _Rig(ros)
    camera = _camera(ros)
    rig.wait_matched(camera)
    good = _solid(16, 16, (10, 20, 30))

    short = Image(height=16, width=16, encoding="rgb8", step=48)
    short.data = bytes(100)
    yuv = Image(height=2, width=2, encoding="yuv422", step=4)
    yuv.data = bytes(8)
    corrupt = CompressedImage(format="jpeg")
    corrupt.data = b"\xff\xd8\xff\xe0\x00\x10JFIF" + bytes(300)

    def send_bad():
        rig.raw.publish(short)
        rig.raw.publish(yuv)
        rig.jpeg.publish(corrupt)

    assert ros.spin_until(
        lambda: camera.rejected["size_mismatch"] and camera.rejected["unsupported_encoding"]
        and camera.rejected["corrupt_compressed"], every=send_bad)
    assert rig.observations == []

    # the node keeps going: the next good frames make a group
    def send_good():
        rig.send_raw(good, encoding="bgr8")
        rig.send_jpeg(good, fmt="png")

    assert ros.spin_until(lambda: rig.observations, every=send_good)
    img = rig.observations[0].images[0]
    assert np.array_equal(np.frombuffer(img.data, np.uint8).reshape(32, 32, 3)[16, 16], [10, 20, 30])

    # a bad frame between good groups does not stop the stream
    count = len(rig.observations)
    send_bad()
    assert ros.spin_until(lambda: len(rig.observations) > count, every=send_good)
    assert {k for k, v in camera.rejected.items() if v} == {"size_mismatch", "unsupported_encoding",
                                                             "corrupt_compressed"}


def test_state_instruction_cleaning_and_nan_state_rejected(ros):
    from sensor_msgs.msg import JointState
    from std_msgs.msg import String

    rig = _Rig(ros, state=True)
    camera = _camera(ros, state_topic=f"{ros.prefix}/joint_states")
    rig.wait_matched(camera)
    frame = _solid(8, 8, (5, 5, 5))

    rig.instruction.publish(String(data="pick\x07 the\tred\x1b cube\n"))  # (a NUL would end the string on the wire)
    assert ros.spin_until(lambda: camera.instruction is not None)
    assert camera.instruction == "pick the red cube "

    # images without a valid state: nothing is published
    nan_state = JointState(name=["a", "b"], position=[0.1, math.nan])

    def send_nan():
        rig.state.publish(nan_state)
        rig.send_raw(frame)
        rig.send_jpeg(frame)

    assert ros.spin_until(lambda: camera.rejected["state_not_finite"] >= 2 and camera.waiting_for_state >= 1,
                          every=send_nan)
    assert rig.observations == []

    def send_good():
        rig.state.publish(JointState(name=["a", "b"], position=[0.25, -0.5]))
        rig.send_raw(frame)
        rig.send_jpeg(frame)

    assert ros.spin_until(lambda: rig.observations, every=send_good)
    msg = rig.observations[0]
    assert list(msg.state) == [0.25, -0.5]
    assert msg.instruction == "pick the red cube "
    # a NaN state after a good one is not replaced by the old value
    rig.state.publish(nan_state)
    assert ros.spin_until(lambda: camera.state is None)


def test_parameters_validated_at_start_and_at_run_time(ros):
    from rclpy.parameter import Parameter

    from oxygen_ros.ros.parameters import ParameterError

    bad = [
        ({"image_size": 0}, "image_size"),
        ({"max_age": -1.0}, "max_age"),
        ({"camera_names": ["only_one"]}, "camera_names"),
        ({"camera_names": ["a", "a"]}, "camera_names"),
        ({"image_topics": [], "compressed_image_topics": []}, "image_topics"),
        ({"image_topics": ["not a topic!"]}, "image_topics"),
        ({"instruction_topic": 7}, "instruction_topic"),
    ]
    for values, name in bad:
        with pytest.raises(ParameterError, match=f"parameter '{name}'"):
            _camera(ros, **values)

    camera = _camera(ros, max_age=1)  # an integer for a float is fine
    assert camera.max_age == 1.0
    result = camera.set_parameters([Parameter("image_size", value=-5)])[0]
    assert not result.successful and "image_size" in result.reason
    result = camera.set_parameters([Parameter("image_size", value="big")])[0]
    assert not result.successful and "integer" in result.reason
    result = camera.set_parameters([Parameter("observation_topic", value="/elsewhere")])[0]
    assert not result.successful and "read-only" in result.reason
    assert camera.set_parameters([Parameter("image_size", value=16)])[0].successful
    assert camera.image_size == 16
    assert camera.set_parameters([Parameter("default_instruction", value="go\x07")])[0].successful
    assert camera.default_instruction == "go"


def test_synthetic_camera_closes_the_loop_through_the_camera_node(ros):
    """SyntheticCamera -> CameraNode -> Observation; ActionChunks move the gripper."""
    from oxygen_ros.msg import ActionChunk, Observation

    from oxygen_ros.core.sim.demonstrations import expert_actions
    from oxygen_ros.ros.qos import OBSERVATION_QOS
    from oxygen_ros.ros.conversions import action_chunk_msg, msg_to_observation
    from oxygen_ros.ros.synthetic_camera import SyntheticCamera

    p = ros.prefix
    sim = ros.add(SyntheticCamera(context=ros.context, parameter_overrides=_params(
        rate_hz=20.0, image_size=32, seed=3, image_topic=f"{p}/image", instruction_topic=f"{p}/instruction",
        joint_state_topic=f"{p}/joint_states", action_topic=f"{p}/actions", retarget_every_s=0.0)))
    camera = _camera(ros, image_topics=[f"{p}/image"], compressed_image_topics=[],
                     state_topic=f"{p}/joint_states", max_age=2.0)
    client = ros.node("oxygen_test_policy")
    observations = []
    client.create_subscription(Observation, f"{p}/observation", observations.append, OBSERVATION_QOS)
    actions = client.create_publisher(ActionChunk, f"{p}/actions", 10)

    assert ros.spin_until(lambda: observations, timeout=15.0)
    obs = msg_to_observation(observations[-1])
    assert obs.instruction == sim.sim.instruction and obs.instruction.startswith("move to the ")
    assert obs.images["base"].shape == (32, 32, 3)
    assert obs.state is not None and np.allclose(obs.state, sim.sim.state, atol=0.11)

    start = np.array(sim.sim.scene.gripper)
    target = np.array(sim.sim.scene.target.position)

    def act():
        step = expert_actions(sim.sim.scene, 1)  # the ideal next move
        actions.publish(action_chunk_msg(client.get_clock().now(), 0, observations[-1].seq,
                                         observations[-1].header.stamp, 0, 0.05, np.vstack([step, step])))

    moved = lambda: sim.actions_applied >= 3
    assert ros.spin_until(moved, every=act, period=0.05)
    assert np.linalg.norm(np.array(sim.sim.scene.gripper) - target) < np.linalg.norm(start - target) or \
        sim.retargets > 0
    assert camera.rejected == {k: 0 for k in camera.rejected}


def test_synthetic_camera_pause_stops_its_images_until_resumed(ros):
    """A camera drop-out as oxygen-soak injects it: a paused synthetic camera
    publishes no image; resumed, it publishes again."""
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import Image

    from oxygen_ros.ros.synthetic_camera import SyntheticCamera

    p = ros.prefix
    sim = ros.add(SyntheticCamera(context=ros.context, parameter_overrides=_params(
        rate_hz=20.0, image_size=32, image_topic=f"{p}/image", instruction_topic=f"{p}/instruction",
        joint_state_topic=f"{p}/joint_states", action_topic=f"{p}/actions")))
    images = []
    ros.node("oxygen_test_viewer").create_subscription(Image, f"{p}/image", images.append, qos_profile_sensor_data)
    assert ros.spin_until(lambda: len(images) >= 2, timeout=15.0), "no image before the pause"
    sim.pause()
    ros.spin_for(0.2)  # what was already on its way
    paused_at = len(images)
    ros.spin_for(1.0)  # 20 periods
    assert len(images) == paused_at
    sim.pause(False)
    assert ros.spin_until(lambda: len(images) >= paused_at + 2, timeout=15.0), "no image after resuming"

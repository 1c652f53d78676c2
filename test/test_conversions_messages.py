"""Tests of oxygen_ros.ros.conversions' messages: Observation in, ActionChunk, TextToken, JointTrajectory out.

No middleware is needed: messages are built, serialized and deserialized
in-process (rclpy.serialization works without rclpy.init).
"""

import array
import math

import numpy as np
import pytest
from builtin_interfaces.msg import Time
from rclpy.serialization import deserialize_message, serialize_message
from sensor_msgs.msg import Image
from std_msgs.msg import Header

from oxygen_ros.core.observation import Observation, ObservationError
from oxygen_ros.core.requests import TokenEvent
from oxygen_ros.ros import conversions as conv
from oxygen_ros.ros.conversions import ImageError


def _rgb(h, w, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


# --------------------------------------------------------------------------
# Observation message
# --------------------------------------------------------------------------

def test_observation_round_trip():
    from oxygen_ros.msg import Observation as ObservationMsg

    images = {"base": _rgb(16, 16, 1), "wrist": _rgb(16, 16, 2)}
    obs = Observation(images=images, instruction="move to the red circle é", state=np.array([0.5, -1.25], np.float32),
                      stamp=1_700_000_000.25)
    headers = {"base": Header(stamp=conv.to_time_msg(1_700_000_000.25), frame_id="cam_base"),
               "wrist": Header(stamp=conv.to_time_msg(1_700_000_000.5), frame_id="cam_w")}
    msg = conv.observation_to_msg(obs, 42, frame_id="rig", image_headers=headers)
    assert msg.seq == 42 and msg.header.frame_id == "rig"
    assert msg.header.stamp == Time(sec=1_700_000_000, nanosec=250_000_000)
    assert list(msg.camera_names) == ["base", "wrist"]
    assert all(img.encoding == "rgb8" for img in msg.images)
    assert msg.images[1].header.frame_id == "cam_w"

    wire = deserialize_message(serialize_message(msg), ObservationMsg)
    back = conv.msg_to_observation(wire)
    assert back.instruction == obs.instruction
    assert np.array_equal(back.state, obs.state) and back.state.dtype == np.float32
    assert back.stamp == pytest.approx(obs.stamp)
    assert back.images.keys() == images.keys()
    for name, rgb in images.items():
        assert np.array_equal(back.images[name], rgb)
    assert back.meta["seq"] == 42 and back.meta["frame_id"] == "rig"
    assert back.meta["image_stamps"]["wrist"] == pytest.approx(1_700_000_000.5, abs=1e-6)


def test_each_image_keeps_its_own_camera_s_stamp():
    """The group's stamp is the oldest image's; every image keeps the stamp its camera gave it, and
    reading the message back gives each camera's own (exactly: pytest.approx's default relative
    tolerance is over 1000 s at these stamps)."""
    images = {"base": _rgb(8, 8, 1), "wrist": _rgb(8, 8, 2)}
    obs = Observation(images=images, instruction="", stamp=1_700_000_000.25)
    headers = {"base": Header(stamp=Time(sec=1_700_000_000, nanosec=250_000_000), frame_id="cam_base"),
               "wrist": Header(stamp=Time(sec=1_700_000_000, nanosec=500_000_000), frame_id="cam_w")}
    msg = conv.observation_to_msg(obs, 3, image_headers=headers)
    assert msg.header.stamp == Time(sec=1_700_000_000, nanosec=250_000_000)
    assert [img.header.stamp for img in msg.images] == [Time(sec=1_700_000_000, nanosec=250_000_000),
                                                        Time(sec=1_700_000_000, nanosec=500_000_000)]
    stamps = conv.msg_to_observation(msg).meta["image_stamps"]
    assert stamps["wrist"] - stamps["base"] == pytest.approx(0.25, abs=1e-6)
    assert stamps["base"] == pytest.approx(1_700_000_000.25, abs=1e-6)


def test_observation_resized_and_without_state():
    obs = Observation(images={"base": _rgb(30, 60)}, instruction="")
    msg = conv.observation_to_msg(obs, 0, image_size=32)
    assert (msg.images[0].height, msg.images[0].width) == (32, 32)
    assert len(msg.state) == 0
    back = conv.msg_to_observation(msg)
    assert back.state is None and back.images["base"].shape == (32, 32, 3)


def test_malformed_observation_msgs_rejected():
    msg = conv.observation_to_msg(Observation(images={"a": _rgb(4, 4)}, instruction="x"), 1)
    msg.camera_names = ["a", "b"]
    with pytest.raises(ObservationError, match="2 names for 1 images"):
        conv.msg_to_observation(msg)
    msg.camera_names = ["a"]
    msg.images = [msg.images[0], deserialize_message(serialize_message(msg.images[0]), Image)]
    msg.camera_names = ["a", "a"]
    with pytest.raises(ObservationError, match="duplicate"):
        conv.msg_to_observation(msg)
    msg.camera_names = ["a", "b"]
    msg.images[1].data = bytes(5)
    with pytest.raises(ImageError, match="camera 'b'") as info:
        conv.msg_to_observation(msg)
    assert info.value.reason == "size_mismatch"
    good = conv.observation_to_msg(Observation(images={"a": _rgb(4, 4)}, instruction="x"), 1)
    good.state = array.array("f", [1.0, math.nan])
    with pytest.raises(ObservationError, match="NaN"):
        conv.msg_to_observation(good)
    good.state = array.array("f", [])
    good.images = []
    good.camera_names = []
    with pytest.raises(ObservationError):
        conv.msg_to_observation(good)


# --------------------------------------------------------------------------
# output messages
# --------------------------------------------------------------------------

def test_action_chunk_msg():
    from oxygen_ros.msg import ActionChunk

    actions = np.arange(12, dtype=np.float32).reshape(4, 3) / 7
    msg = conv.action_chunk_msg(Time(sec=5, nanosec=1), 17, 9, 4.5, 2, 0.02, actions, header_frame_id="base_link")
    wire = deserialize_message(serialize_message(msg), ActionChunk)
    assert wire.header.stamp == Time(sec=5, nanosec=1) and wire.header.frame_id == "base_link"
    assert (wire.frame_id, wire.observation_seq, wire.offset) == (17, 9, 2)
    assert wire.observation_stamp == Time(sec=4, nanosec=500_000_000)
    assert (wire.horizon, wire.action_dim) == (4, 3)
    assert wire.control_period == pytest.approx(0.02)
    assert np.array_equal(conv.action_chunk_array(wire), actions)
    with pytest.raises(ValueError, match="NaN"):
        conv.action_chunk_msg(0.0, 0, 0, 0.0, 0, 0.02, np.array([[math.nan]]))
    with pytest.raises(ValueError, match="matrix"):
        conv.action_chunk_msg(0.0, 0, 0, 0.0, 0, 0.02, np.zeros(3))
    with pytest.raises(ValueError, match="control_period"):
        conv.action_chunk_msg(0.0, 0, 0, 0.0, 0, 0.0, np.zeros((1, 2)))
    with pytest.raises(ValueError, match="offset"):
        conv.action_chunk_msg(0.0, 0, 0, 0.0, -1, 0.1, np.zeros((1, 2)))


def test_text_token_msg():
    from oxygen_ros.msg import TextToken

    event = TokenEvent(request_id=3, client_id="cli", frame_id=8, index=2, token_id=77, piece=" red", done=True,
                       finish_reason="eos")
    msg = conv.text_token_msg(Time(sec=1), event)
    wire = deserialize_message(serialize_message(msg), TextToken)
    assert (wire.request_id, wire.client_id, wire.frame_id, wire.index) == (3, "cli", 8, 2)
    assert (wire.token_id, wire.piece, wire.done, wire.finish_reason) == (77, " red", True, TextToken.FINISH_EOS)
    assert wire.reason == ""
    running = TokenEvent(3, "", 8, 0, 5, "a", False, "")
    assert conv.text_token_msg(0.0, running).finish_reason == ""
    full = TokenEvent(4, "cli", 8, 0, -1, "", True, "rejected", detail="the queue of waiting requests is full")
    assert conv.text_token_msg(0.0, full).reason == "the queue of waiting requests is full"


def test_joint_trajectory_msg():
    actions = np.array([[0.0, 1.0], [0.5, 1.5], [1.0, 2.0]], np.float32)
    msg = conv.joint_trajectory_msg(Time(sec=10), ["j1", "j2"], actions, 0.1, frame_id="base")
    assert list(msg.joint_names) == ["j1", "j2"] and msg.header.frame_id == "base"
    assert [list(p.positions) for p in msg.points] == actions.tolist()
    assert [p.time_from_start.sec * 1e9 + p.time_from_start.nanosec for p in msg.points] == [0, 1e8, 2e8]
    with pytest.raises(ValueError, match="2 joint names"):
        conv.joint_trajectory_msg(0.0, ["a", "b"], np.zeros((2, 3)), 0.1)
    with pytest.raises(ValueError, match="unique"):
        conv.joint_trajectory_msg(0.0, ["a", "a"], np.zeros((2, 2)), 0.1)


def test_stamps():
    assert conv.to_time_msg(1.5) == Time(sec=1, nanosec=500_000_000)
    assert conv.stamp_to_ns(conv.ns_to_time_msg(123_456_789_012)) == 123_456_789_012
    with pytest.raises(ValueError):
        conv.to_time_msg(-1.0)
    with pytest.raises(TypeError):
        conv.to_time_msg("now")

"""Messages for the tests to send, well formed or not (no rclpy context needed).

* :func:`observation_msg` - an ``oxygen_ros/Observation`` message from numpy.
* :func:`raw_image` / :func:`compressed_image` / :func:`png_with_size` / :func:`cdr_with` -
  input messages, well formed or not, as a camera driver or a careless publisher sends them.
* :func:`bag_recording` - a small recording of camera images, joint states and an instruction.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np


def observation_msg(seq: int, stamp_ns: int, *, size: int = 32, instruction: str = "pick up the red cube",
                    state=(0.1, -0.2)):
    """An Observation message with one camera ``base`` whose image depends on ``seq``."""
    from oxygen_ros.core.observation import Observation
    from oxygen_ros.ros.conversions import ns_to_time_msg, observation_to_msg

    rng = np.random.default_rng(seq)
    image = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    obs = Observation({"base": image}, instruction, None if state is None else np.asarray(state, np.float32))
    return observation_to_msg(obs, seq, stamp=ns_to_time_msg(stamp_ns))


def raw_image(encoding="rgb8", height=4, width=5, step=None, data=None, is_bigendian=0):
    """A sensor_msgs/Image; ``step`` and ``data`` default to what the encoding and size need (zeros)."""
    from sensor_msgs.msg import Image

    from oxygen_ros.ros.conversions import SUPPORTED_ENCODINGS

    channels = SUPPORTED_ENCODINGS.get(encoding, 3)
    step = width * channels if step is None else step
    msg = Image(height=height, width=width, encoding=encoding, step=step, is_bigendian=is_bigendian)
    msg.data = bytes(height * step) if data is None else data
    return msg


def compressed_image(data: bytes, fmt: str = "png"):
    from sensor_msgs.msg import CompressedImage

    msg = CompressedImage(format=fmt)
    msg.data = data
    return msg


def png_with_size(width: int, height: int) -> bytes:
    """A syntactically valid PNG header claiming width x height (no pixel data)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return b"\x89PNG\r\n\x1a\n" + chunk


INVALID_UTF8 = b"\xff\xfe\xc3("  # a stray continuation byte, a truncated sequence


def cdr_with(msg, marker: bytes, replacement: bytes) -> bytes:
    """``msg`` serialized, with the bytes of one string replaced (same length): how a
    publisher that does not check its text (C++, a bridge) can put invalid UTF-8 on the wire."""
    from rclpy.serialization import serialize_message

    data = serialize_message(msg)
    assert data.count(marker) == 1 and len(marker) == len(replacement)
    return data.replace(marker, replacement)


RECORDED_T0 = 1_700_000_000_000_000_000  # recorded time of a recording's first message (ns)


def bag_recording(prefix="", images=6, spacing_ns=20_000_000):
    """A small recording, as (topic, message, recorded time ns) for ``write_bag``: a latched
    instruction at RECORDED_RECORDED_T0, then images with joint states in between, ``spacing_ns`` apart."""
    from sensor_msgs.msg import JointState
    from std_msgs.msg import String

    from oxygen_ros.ros.conversions import ns_to_time_msg, rgb_to_image_msg

    out = [(f"{prefix}/oxygen/instruction", String(data="move to the blue square"), RECORDED_T0)]
    for i in range(images):
        t = RECORDED_T0 + (i + 1) * spacing_ns
        rgb = np.full((8, 12, 3), i * 10, np.uint8)
        out.append((f"{prefix}/camera/image_raw", rgb_to_image_msg(rgb, "rgb8", ns_to_time_msg(t - 1000), "cam"), t))
        state = JointState(name=["gripper_x", "gripper_y"], position=[i * 0.1, -i * 0.1])
        state.header.stamp = ns_to_time_msg(t + 500)
        out.append((f"{prefix}/joint_states", state, t + 1000))
    return out

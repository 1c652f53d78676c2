"""Messages for the tests to send, well formed or not (no rclpy context needed).

* :func:`observation_msg` - an ``oxygen_ros/Observation`` message from numpy.
* :func:`raw_image` / :func:`compressed_image` / :func:`png_with_size` / :func:`cdr_with` -
  input messages, well formed or not, as a camera driver or a careless publisher sends them.
* :func:`png_file` / :func:`png_with_idat_changed` / :func:`jpeg_with_scan_changed` - JPEG and
  PNG data damaged inside (bytes of the compressed data changed, the file structure intact).
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


def png_chunk(ctype: bytes, body: bytes) -> bytes:
    """One PNG chunk: length, type, body, CRC."""
    return struct.pack(">I", len(body)) + ctype + body + struct.pack(">I", zlib.crc32(ctype + body))


def png_with_size(width: int, height: int) -> bytes:
    """A syntactically valid PNG header claiming width x height (no pixel data)."""
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))


_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def png_file(rgb, *, level: int = 6, interlaced: bool = False, idat_chunks: int = 1, checksum_apart: bool = False,
             extra_rows: int = 0, trailing: bytes = b"") -> bytes:
    """An 8-bit RGB PNG of ``rgb`` written here (rows unfiltered; zlib ``level``, 0: stored, so
    that a changed byte is a changed pixel), its zlib stream split over ``idat_chunks`` IDAT
    chunks (``checksum_apart``: and its Adler-32 in one more, as an encoder writing fixed-size
    chunks may happen to); ``extra_rows`` (negative: fewer) and ``trailing`` (bytes after the
    zlib stream) make its image data disagree with its IHDR, the chunks' CRCs all correct."""
    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    height, width = rgb.shape[:2]
    passes = [rgb[y0::dy, x0::dx] for x0, y0, dx, dy in _ADAM7] if interlaced else [rgb]
    rows = [row for sub in passes if sub.size for row in sub]
    rows = rows[:len(rows) + extra_rows] if extra_rows < 0 else rows + rows[:extra_rows]
    stream = zlib.compress(b"".join(b"\0" + row.tobytes() for row in rows), level)
    body, tail = (stream[:-4], stream[-4:] + trailing) if checksum_apart else (stream + trailing, b"")
    step = -(-len(body) // idat_chunks)
    idat = [body[i:i + step] for i in range(0, len(body), step)] + ([tail] if tail else [])
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 1 if interlaced else 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + b"".join(png_chunk(b"IDAT", c) for c in idat)
            + png_chunk(b"IEND", b""))


def png_with_idat_changed(png: bytes, *, at: float = 0.5, fix_crc: bool = False) -> bytes:
    """``png`` with one byte of its first IDAT chunk's data changed (``at``: where, as a fraction
    of the chunk); with ``fix_crc`` the chunk's CRC is recomputed, so that only the zlib stream
    (its Adler-32) tells."""
    i = png.index(b"IDAT")
    length = struct.unpack(">I", png[i - 4:i])[0]
    out = bytearray(png)
    out[i + 4 + int(length * at)] ^= 0x5A
    if fix_crc:
        out[i + 4 + length:i + 8 + length] = struct.pack(">I", zlib.crc32(bytes(out[i:i + 4 + length])))
    return bytes(out)


def jpeg_with_scan_changed(jpeg: bytes, count: int = 16) -> bytes:
    """``jpeg`` with ``count`` bytes inside its entropy-coded (scan) data changed, spread over
    its middle third; markers, lengths and byte stuffing (0xFF 0x00) are left intact."""
    sos = jpeg.index(b"\xff\xda")
    start = sos + 2 + int.from_bytes(jpeg[sos + 2:sos + 4], "big")
    end = len(jpeg) - 2  # EOI
    out = bytearray(jpeg)
    first, span = start + (end - start) // 3, (end - start) // 3
    for k in range(count):
        p = first + span * k // count
        while 0xFF in (out[p - 1], out[p], out[p] ^ 0x55):  # never make or break a marker
            p += 1
        out[p] ^= 0x55
    return bytes(out)


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


#: ``oxygen_ros/TextToken`` as it was before it named its observation (observation_seq and
#: observation_stamp): what a bag recorded by an older oxygen_ros holds.
OLD_TEXT_TOKEN_MSG = """string FINISH_EOS="eos"
string FINISH_LENGTH="length"
string FINISH_REJECTED="rejected"
string FINISH_CANCELLED="cancelled"
std_msgs/Header header
uint64 request_id
string client_id
uint64 frame_id
uint32 index
int32 token_id
string piece
bool done
string finish_reason
string reason
"""


def bag_with_old_text_tokens(path, messages, text_topic: str = "/oxygen/text", tokens: int = 2):
    """A bag at ``path`` holding ``messages`` ((topic, message, ns), written as ``write_bag`` does)
    and ``tokens`` TextTokens on ``text_topic`` of :data:`OLD_TEXT_TOKEN_MSG`'s definition, as an
    older oxygen_ros recorded them (rosbags serializes them: rclpy no longer knows that type)."""
    from rclpy.serialization import serialize_message
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    from oxygen_ros.ros.bags import type_name

    store = get_typestore(Stores.ROS2_KILTED)
    store.register(get_types_from_msg(OLD_TEXT_TOKEN_MSG, "oxygen_ros/msg/TextToken"))
    Token, Header, Time = (store.types[t] for t in ("oxygen_ros/msg/TextToken", "std_msgs/msg/Header",
                                                    "builtin_interfaces/msg/Time"))
    writer = Writer(path, version=9, storage_plugin=StoragePlugin.MCAP)
    writer.open()
    connections = {}
    for topic, msg, ns in messages:
        if topic not in connections:
            connections[topic] = writer.add_connection(topic, type_name(msg), typestore=store)
        writer.write(connections[topic], ns, serialize_message(msg))
    text = writer.add_connection(text_topic, "oxygen_ros/msg/TextToken", typestore=store)
    for i in range(tokens):
        token = Token(header=Header(stamp=Time(sec=1, nanosec=i), frame_id=""), request_id=1, client_id="",
                      frame_id=1, index=i, token_id=5, piece="old", done=i == tokens - 1,
                      finish_reason="eos" if i == tokens - 1 else "", reason="")
        writer.write(text, RECORDED_T0 + i, store.serialize_cdr(token, "oxygen_ros/msg/TextToken"))
    writer.close()
    return path

"""Conversions between ROS messages and the core's numpy / dataclass types.

Images
    :func:`image_msg_to_rgb` and :func:`compressed_msg_to_rgb` turn a
    ``sensor_msgs/Image`` (encodings :data:`SUPPORTED_ENCODINGS`) or a
    ``sensor_msgs/CompressedImage`` (JPEG or PNG) into an ``HxWx3`` uint8 RGB
    array. Every way a message can be malformed is checked explicitly *before*
    cv_bridge / OpenCV see the data, and reported as an :class:`ImageError`
    whose ``reason`` is one of :data:`IMAGE_ERROR_REASONS` (a short key, used
    for counters) and whose message says what was wrong. Nothing else escapes.
    :func:`rgb_to_image_msg` and :func:`rgb_to_compressed_msg` go the other
    way; :func:`to_model_image` resizes to the model's square resolution
    (aspect kept, black padding, as the model was trained).

Observations
    :func:`observation_to_msg` / :func:`msg_to_observation` convert between the
    ``oxygen_ros/Observation`` message and
    :class:`oxygen_ros.core.observation.Observation`.

Outputs of the inference node
    :func:`action_chunk_msg`, :func:`text_token_msg`, :func:`joint_trajectory_msg`.

Times
    Wherever a stamp is taken it may be a ``builtin_interfaces/Time``, an
    ``rclpy.time.Time`` or a number of **seconds** (int or float);
    :func:`to_time_msg` does the conversion, :func:`stamp_to_ns` /
    :func:`ns_to_time_msg` convert to and from integer nanoseconds.
"""

from __future__ import annotations

import array
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import cv2
import numpy as np
from builtin_interfaces.msg import Duration, Time
from cv_bridge import CvBridge, CvBridgeError
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import Header
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from oxygen_ros.msg import ActionChunk, TextToken
from oxygen_ros.msg import Observation as ObservationMsg

if TYPE_CHECKING:
    from oxygen_ros.core.observation import Observation

# oxygen_ros.core.observation (resizing, the Observation dataclass) imports
# torch and transformers, seconds of start-up: it is imported where it is
# used, so that the nodes that only publish images (synthetic camera, bag
# player) start quickly.


def core_observation():
    from oxygen_ros.core import observation

    return observation

#: Raw image encodings accepted by :func:`image_msg_to_rgb` -> channels.
SUPPORTED_ENCODINGS: dict[str, int] = {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4, "mono8": 1}
#: Compressed formats accepted by :func:`compressed_msg_to_rgb` (detected from the data).
SUPPORTED_COMPRESSED_FORMATS = ("jpeg", "png")
#: Default bound on an image's size in bytes (message data and decoded RGB).
DEFAULT_MAX_IMAGE_BYTES = 50_000_000

#: Every ``ImageError.reason``.
IMAGE_ERROR_REASONS = (
    "unsupported_encoding",  # Image.encoding not in SUPPORTED_ENCODINGS
    "unsupported_format",  # CompressedImage data is neither JPEG nor PNG
    "zero_size",  # width or height is 0
    "empty_data",  # no data at all
    "too_large",  # data or decoded image beyond the byte limit
    "bad_step",  # step smaller than width * bytes per pixel
    "size_mismatch",  # len(data) != height * step
    "corrupt_compressed",  # JPEG/PNG data that does not decode
    "conversion_failed",  # cv_bridge / OpenCV failed after all checks passed
)

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_JPEG_MAGIC = b"\xff\xd8\xff"
# JPEG start-of-frame markers (they carry the image size): C0-CF except DHT
# (C4), JPG (C8) and DAC (CC).
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}

_bridge = CvBridge()


class ImageError(ValueError):
    """An image message cannot be used; ``reason`` is one of :data:`IMAGE_ERROR_REASONS`."""

    def __init__(self, reason: str, detail: str):
        assert reason in IMAGE_ERROR_REASONS, reason
        super().__init__(f"{reason.replace('_', ' ')}: {detail}")
        self.reason = reason
        self.detail = detail


# --------------------------------------------------------------------------
# Times
# --------------------------------------------------------------------------


def ns_to_time_msg(ns: int) -> Time:
    """Integer nanoseconds -> ``builtin_interfaces/Time`` (must be >= 0)."""
    ns = int(ns)
    if ns < 0:
        raise ValueError(f"a ROS time cannot be negative, got {ns} ns")
    return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def stamp_to_ns(stamp: Time) -> int:
    """``builtin_interfaces/Time`` -> integer nanoseconds."""
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def to_time_msg(stamp: Any) -> Time:
    """A ``Time`` message from a ``Time`` message, an ``rclpy.time.Time`` or seconds."""
    if isinstance(stamp, Time):
        return stamp
    if hasattr(stamp, "to_msg") and hasattr(stamp, "nanoseconds"):  # rclpy.time.Time
        return stamp.to_msg()
    if isinstance(stamp, (int, float, np.integer, np.floating)) and not isinstance(stamp, bool):
        seconds = float(stamp)
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"a stamp in seconds must be finite and >= 0, got {stamp!r}")
        whole = math.floor(seconds)  # split first: seconds * 1e9 would lose the nanoseconds
        return ns_to_time_msg(whole * 1_000_000_000 + round((seconds - whole) * 1e9))
    raise TypeError(f"expected a builtin_interfaces/Time, rclpy Time or seconds, got {type(stamp).__name__}")


def _seconds(stamp: Time) -> float:
    return stamp.sec + stamp.nanosec * 1e-9


def _duration(seconds: float) -> Duration:
    ns = round(seconds * 1e9)
    return Duration(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def _header(stamp: Any, frame_id: str = "") -> Header:
    return Header(stamp=to_time_msg(stamp), frame_id=str(frame_id))


# --------------------------------------------------------------------------
# Images: messages -> RGB
# --------------------------------------------------------------------------


class _PackedImage:
    """What cv_bridge reads from an Image, with the row padding removed."""

    __slots__ = ("data", "encoding", "height", "is_bigendian", "step", "width")

    def __init__(self, height: int, width: int, encoding: str, data: bytes):
        self.height, self.width, self.encoding = height, width, encoding
        self.is_bigendian = 0  # 8-bit channels: byte order does not apply
        self.step = len(data) // height
        self.data = data


def check_image_msg(msg: Image, max_bytes: int = DEFAULT_MAX_IMAGE_BYTES) -> int:
    """Raise :class:`ImageError` unless ``msg`` is a usable raw image; return its channels."""
    encoding = msg.encoding
    if encoding not in SUPPORTED_ENCODINGS:
        raise ImageError(
            "unsupported_encoding",
            f"encoding {encoding!r} is not supported; use one of {sorted(SUPPORTED_ENCODINGS)}",
        )
    channels = SUPPORTED_ENCODINGS[encoding]
    height, width, step, size = int(msg.height), int(msg.width), int(msg.step), len(msg.data)
    if height == 0 or width == 0:
        raise ImageError("zero_size", f"image is {width}x{height} pixels")
    if size == 0:
        raise ImageError("empty_data", f"{width}x{height} {encoding} image has no data")
    biggest = max(size, height * step, height * width * 3)
    if biggest > max_bytes:
        raise ImageError("too_large", f"{width}x{height} {encoding} image needs {biggest} bytes, limit {max_bytes}")
    if step < width * channels:
        raise ImageError("bad_step", f"step {step} < width {width} x {channels} bytes per pixel")
    if size != height * step:
        raise ImageError(
            "size_mismatch", f"data has {size} bytes, height {height} x step {step} = {height * step} expected"
        )
    return channels


def image_msg_to_rgb(msg: Image, max_bytes: int = DEFAULT_MAX_IMAGE_BYTES) -> np.ndarray:
    """A ``sensor_msgs/Image`` as a new ``HxWx3`` uint8 RGB array (raises :class:`ImageError`)."""
    channels = check_image_msg(msg, max_bytes)
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    row = width * channels
    source: Any = msg
    if step != row or msg.is_bigendian:
        # cv_bridge ignores `step` (padded rows would shear the image) and
        # mishandles big-endian flags with numpy 2; 8-bit data needs neither.
        rows = np.frombuffer(msg.data, dtype=np.uint8).reshape(height, step)[:, :row]
        source = _PackedImage(height, width, msg.encoding, rows.tobytes())
    try:
        rgb = _bridge.imgmsg_to_cv2(source, desired_encoding="rgb8")
    except (CvBridgeError, cv2.error, KeyError, TypeError, ValueError) as exc:
        raise ImageError("conversion_failed", f"cv_bridge could not convert {msg.encoding}: {exc}") from exc
    return np.array(rgb, dtype=np.uint8, copy=True, order="C").reshape(height, width, 3)


def _png_size(data: memoryview) -> tuple[int, int] | None:
    if len(data) < 24 or bytes(data[12:16]) != b"IHDR":
        return None
    return int.from_bytes(data[20:24], "big"), int.from_bytes(data[16:20], "big")


def _jpeg_size(data: memoryview) -> tuple[int, int] | None:
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image / start of scan before any frame header
            return None
        length = (data[i + 2] << 8) | data[i + 3]
        if length < 2:
            return None
        if marker in _JPEG_SOF:
            if i + 9 > n:
                return None
            return (data[i + 5] << 8) | data[i + 6], (data[i + 7] << 8) | data[i + 8]
        i += 2 + length
    return None


def check_compressed_msg(msg: CompressedImage, max_bytes: int = DEFAULT_MAX_IMAGE_BYTES) -> tuple[str, int, int]:
    """Raise :class:`ImageError` unless ``msg`` looks decodable; return (format, height, width).

    The format is taken from the data (JPEG or PNG signature), not from
    ``msg.format``, and the size from the JPEG frame header / PNG IHDR chunk,
    so that an oversized image is refused before it is decoded.
    """
    size = len(msg.data)
    if size == 0:
        raise ImageError("empty_data", f"compressed image (format {msg.format!r}) has no data")
    if size > max_bytes:
        raise ImageError("too_large", f"compressed image has {size} bytes, limit {max_bytes}")
    data = memoryview(msg.data).cast("B")
    head = bytes(data[:8])
    if head.startswith(_PNG_MAGIC):
        fmt, dims = "png", _png_size(data)
    elif head.startswith(_JPEG_MAGIC):
        fmt, dims = "jpeg", _jpeg_size(data)
    else:
        raise ImageError(
            "unsupported_format",
            f"data (format {msg.format!r}, starting {head.hex()}) is neither JPEG nor PNG",
        )
    if dims is None:
        raise ImageError("corrupt_compressed", f"{fmt} data has no readable image header ({size} bytes)")
    height, width = dims
    if height == 0 or width == 0:
        raise ImageError("zero_size", f"{fmt} header says {width}x{height} pixels")
    if height * width * 3 > max_bytes:
        raise ImageError(
            "too_large", f"{fmt} image of {width}x{height} decodes to {height * width * 3} bytes, limit {max_bytes}"
        )
    return fmt, height, width


def compressed_msg_to_rgb(msg: CompressedImage, max_bytes: int = DEFAULT_MAX_IMAGE_BYTES) -> np.ndarray:
    """A JPEG/PNG ``sensor_msgs/CompressedImage`` as a new ``HxWx3`` uint8 RGB array."""
    fmt, height, width = check_compressed_msg(msg, max_bytes)
    try:
        decoded = _bridge.compressed_imgmsg_to_cv2(msg, desired_encoding="passthrough")
    except (CvBridgeError, cv2.error, TypeError, ValueError) as exc:
        raise ImageError("corrupt_compressed", f"{fmt} data does not decode: {exc}") from exc
    if decoded is None or decoded.size == 0:
        raise ImageError("corrupt_compressed", f"{fmt} data ({len(msg.data)} bytes) does not decode")
    if decoded.shape[:2] != (height, width):
        raise ImageError(
            "corrupt_compressed", f"{fmt} decoded to {decoded.shape[1]}x{decoded.shape[0]}, header says {width}x{height}"
        )
    if decoded.dtype != np.uint8:  # 16-bit PNG
        decoded = (decoded >> 8).astype(np.uint8)
    if decoded.ndim == 2:
        code = cv2.COLOR_GRAY2RGB
    elif decoded.shape[2] == 4:
        code = cv2.COLOR_BGRA2RGB
    elif decoded.shape[2] == 3:
        code = cv2.COLOR_BGR2RGB
    else:
        raise ImageError("corrupt_compressed", f"{fmt} decoded to an unexpected shape {decoded.shape}")
    return np.ascontiguousarray(cv2.cvtColor(decoded, code))


def to_model_image(rgb: np.ndarray, size: int) -> np.ndarray:
    """Resize to ``size x size`` keeping the aspect ratio, padding with black."""
    return core_observation().resize_with_pad(rgb, int(size))


# --------------------------------------------------------------------------
# Images: RGB -> messages
# --------------------------------------------------------------------------


def _check_rgb(rgb: np.ndarray) -> np.ndarray:
    rgb = np.asarray(rgb)
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3 or 0 in rgb.shape:
        raise ValueError(f"expected a non-empty HxWx3 uint8 RGB array, got {rgb.dtype} {rgb.shape}")
    return rgb


def rgb_to_image_msg(rgb: np.ndarray, encoding: str = "rgb8", stamp: Any = 0.0, frame_id: str = "") -> Image:
    """An ``HxWx3`` uint8 RGB array as a ``sensor_msgs/Image`` in ``encoding``.

    The data is packed (``step = width * channels``). Built directly rather
    than with cv_bridge's ``cv2_to_imgmsg``, which calls numpy's
    ``ndarray.tostring`` (removed in numpy 2.3).
    """
    rgb = _check_rgb(rgb)
    if encoding not in SUPPORTED_ENCODINGS:
        raise ValueError(f"encoding {encoding!r} is not supported; use one of {sorted(SUPPORTED_ENCODINGS)}")
    if encoding == "rgb8":
        pixels = rgb
    else:
        code = {
            "bgr8": cv2.COLOR_RGB2BGR,
            "rgba8": cv2.COLOR_RGB2RGBA,
            "bgra8": cv2.COLOR_RGB2BGRA,
            "mono8": cv2.COLOR_RGB2GRAY,
        }[encoding]
        pixels = cv2.cvtColor(np.ascontiguousarray(rgb), code)
    height, width = rgb.shape[:2]
    msg = Image(
        header=_header(stamp, frame_id),
        height=height,
        width=width,
        encoding=encoding,
        is_bigendian=0,
        step=width * SUPPORTED_ENCODINGS[encoding],
    )
    msg.data = array.array("B", np.ascontiguousarray(pixels).tobytes())
    return msg


def rgb_to_compressed_msg(
    rgb: np.ndarray, fmt: str = "jpeg", stamp: Any = 0.0, frame_id: str = "", quality: int = 95
) -> CompressedImage:
    """An ``HxWx3`` uint8 RGB array as a JPEG or PNG ``sensor_msgs/CompressedImage``."""
    rgb = _check_rgb(rgb)
    if fmt not in SUPPORTED_COMPRESSED_FORMATS:
        raise ValueError(f"format {fmt!r} is not supported; use one of {list(SUPPORTED_COMPRESSED_FORMATS)}")
    params = [cv2.IMWRITE_JPEG_QUALITY, int(quality)] if fmt == "jpeg" else []
    ok, buf = cv2.imencode("." + fmt, cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2BGR), params)
    if not ok:  # pragma: no cover - OpenCV encodes any 8-bit 3-channel image
        raise ValueError(f"OpenCV could not encode a {rgb.shape} image as {fmt}")
    msg = CompressedImage(header=_header(stamp, frame_id), format=fmt)
    msg.data = array.array("B", buf.tobytes())
    return msg


# --------------------------------------------------------------------------
# Observation
# --------------------------------------------------------------------------


def observation_to_msg(
    observation: Observation,
    seq: int,
    *,
    stamp: Any = None,
    frame_id: str = "",
    image_size: int | None = None,
    image_headers: Mapping[str, Header] | None = None,
) -> ObservationMsg:
    """An :class:`Observation` as an ``oxygen_ros/Observation`` message.

    ``stamp`` (default ``observation.stamp``, seconds) should be the capture
    time of the oldest image. Images are resized to ``image_size`` (aspect kept,
    black padding) when given, and sent as rgb8 in the observation's camera
    order; ``image_headers`` gives each camera image's header (default: the
    observation's stamp and an empty frame id).
    """
    if int(seq) < 0:
        raise ValueError(f"seq must be >= 0, got {seq}")
    header = _header(observation.stamp if stamp is None else stamp, frame_id)
    msg = ObservationMsg(header=header, seq=int(seq), instruction=observation.instruction)
    names, images = [], []
    for name, rgb in observation.images.items():
        if image_size is not None:
            rgb = to_model_image(rgb, image_size)
        own = (image_headers or {}).get(name)
        img = rgb_to_image_msg(rgb, "rgb8", own.stamp if own is not None else header.stamp,
                               own.frame_id if own is not None else "")
        names.append(name)
        images.append(img)
    msg.camera_names = names
    msg.images = images
    state = observation.state
    msg.state = array.array("f", np.zeros(0, np.float32).tobytes() if state is None
                            else np.asarray(state, dtype=np.float32).tobytes())
    return msg


def msg_to_observation(msg: ObservationMsg, max_bytes: int = DEFAULT_MAX_IMAGE_BYTES) -> Observation:
    """An ``oxygen_ros/Observation`` message as an :class:`Observation`.

    Raises :class:`ObservationError` for a malformed group (names and images
    disagreeing, duplicate names, bad state) and :class:`ImageError` for a bad
    image. ``meta`` holds ``seq``, ``frame_id`` and ``image_stamps`` (seconds).
    """
    core = core_observation()
    ObservationError = core.ObservationError
    names, images = list(msg.camera_names), list(msg.images)
    if len(names) != len(images):
        raise ObservationError("camera_names", f"{len(names)} names for {len(images)} images")
    if len(set(names)) != len(names):
        raise ObservationError("camera_names", f"duplicate camera names in {names}")
    decoded = {}
    for name, img in zip(names, images):
        try:
            decoded[name] = image_msg_to_rgb(img, max_bytes)
        except ImageError as exc:
            raise ImageError(exc.reason, f"camera {name!r}: {exc.detail}") from exc
    state = np.frombuffer(msg.state, dtype=np.float32).copy() if len(msg.state) else None
    return core.Observation(
        images=decoded,
        instruction=msg.instruction,
        state=state,
        stamp=_seconds(msg.header.stamp),
        meta={
            "seq": int(msg.seq),
            "frame_id": msg.header.frame_id,
            "image_stamps": {n: _seconds(i.header.stamp) for n, i in zip(names, images)},
        },
    )


# --------------------------------------------------------------------------
# Outputs of the inference node
# --------------------------------------------------------------------------


def _actions_2d(actions: Any) -> np.ndarray:
    a = np.asarray(actions, dtype=np.float32)
    if a.ndim != 2:
        raise ValueError(f"actions must be a [horizon, action_dim] matrix, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError("actions contain NaN or infinite values")
    return np.ascontiguousarray(a)


def _period(control_period: float) -> float:
    period = float(control_period)
    if not math.isfinite(period) or period <= 0:
        raise ValueError(f"control_period must be a finite number of seconds > 0, got {control_period!r}")
    return period


def action_chunk_msg(
    header_stamp: Any,
    frame_id: int,
    observation_seq: int,
    observation_stamp: Any,
    offset: int,
    control_period: float,
    actions: np.ndarray,
    *,
    header_frame_id: str = "",
) -> ActionChunk:
    """An ``ActionChunk``: row ``i`` of ``actions`` ([horizon, action_dim]) is due at
    ``header_stamp + i * control_period``. ``frame_id`` is the engine's frame
    counter (the message's uint64 ``frame_id``); ``header_frame_id`` is the
    robot/control frame that goes into ``header.frame_id``."""
    a = _actions_2d(actions)
    for name, value in (("frame_id", frame_id), ("observation_seq", observation_seq), ("offset", offset)):
        if int(value) < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    msg = ActionChunk(
        header=_header(header_stamp, header_frame_id),
        frame_id=int(frame_id),
        observation_seq=int(observation_seq),
        observation_stamp=to_time_msg(observation_stamp),
        offset=int(offset),
        control_period=_period(control_period),
        horizon=a.shape[0],
        action_dim=a.shape[1],
    )
    msg.actions = array.array("f", a.tobytes())
    return msg


def action_chunk_array(msg: ActionChunk) -> np.ndarray:
    """The actions of an ``ActionChunk`` as a float32 ``[horizon, action_dim]`` array."""
    a = np.asarray(msg.actions, dtype=np.float32)
    if a.size != msg.horizon * msg.action_dim:
        raise ValueError(f"ActionChunk has {a.size} values, horizon {msg.horizon} x action_dim {msg.action_dim} expected")
    return a.reshape(msg.horizon, msg.action_dim)


def text_token_msg(stamp: Any, event: Any, *, header_frame_id: str = "") -> TextToken:
    """A ``TextToken`` from a :class:`oxygen_ros.core.requests.TokenEvent`."""
    reason = getattr(event.finish_reason, "value", event.finish_reason) or ""
    return TextToken(
        header=_header(stamp, header_frame_id),
        request_id=int(event.request_id),
        client_id=str(event.client_id),
        frame_id=int(event.frame_id),
        index=int(event.index),
        token_id=int(event.token_id),
        piece=str(event.piece),
        done=bool(event.done),
        finish_reason=str(reason),
    )


def joint_trajectory_msg(
    stamp: Any,
    joint_names: Sequence[str],
    actions: np.ndarray,
    control_period: float,
    *,
    frame_id: str = "",
) -> JointTrajectory:
    """A ``trajectory_msgs/JointTrajectory`` with one point per action row.

    Row ``i`` becomes the point's ``positions`` with ``time_from_start = i *
    control_period`` (so the header stamp is when row 0 is due, as in
    ``ActionChunk``). ``joint_names`` must name every column.
    """
    a = _actions_2d(actions)
    names = [str(n) for n in joint_names]
    if len(names) != a.shape[1]:
        raise ValueError(f"{len(names)} joint names for actions with {a.shape[1]} columns")
    if len(set(names)) != len(names) or not all(names):
        raise ValueError(f"joint names must be unique and non-empty, got {names}")
    period = _period(control_period)
    msg = JointTrajectory(header=_header(stamp, frame_id), joint_names=names)
    points = []
    for i, row in enumerate(a.astype(np.float64)):
        point = JointTrajectoryPoint(time_from_start=_duration(i * period))
        point.positions = array.array("d", row.tobytes())
        points.append(point)
    msg.points = points
    return msg


__all__ = [
    "DEFAULT_MAX_IMAGE_BYTES",
    "IMAGE_ERROR_REASONS",
    "SUPPORTED_COMPRESSED_FORMATS",
    "SUPPORTED_ENCODINGS",
    "ImageError",
    "action_chunk_array",
    "action_chunk_msg",
    "check_compressed_msg",
    "check_image_msg",
    "compressed_msg_to_rgb",
    "core_observation",
    "image_msg_to_rgb",
    "joint_trajectory_msg",
    "msg_to_observation",
    "ns_to_time_msg",
    "observation_to_msg",
    "rgb_to_compressed_msg",
    "rgb_to_image_msg",
    "stamp_to_ns",
    "text_token_msg",
    "to_model_image",
    "to_time_msg",
]

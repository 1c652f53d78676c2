"""Image messages <-> ``HxWx3`` uint8 RGB arrays, checked first, then decoded.

:func:`image_msg_to_rgb` and :func:`compressed_msg_to_rgb` turn a
``sensor_msgs/Image`` (encodings :data:`~.image_checks.SUPPORTED_ENCODINGS`)
or a ``sensor_msgs/CompressedImage`` (JPEG or PNG) into an RGB array after the
checks of :mod:`.image_checks`; nothing but an :class:`~.image_checks.ImageError`
escapes. Raw images go through cv_bridge; JPEG is decoded by simplejpeg
(libjpeg-turbo) in strict mode, so that data which decodes only with libjpeg
warnings (OpenCV would return a partly grey image) is refused as ``damaged``;
PNG is checked by :func:`~.image_checks.check_png_data` (CRCs, zlib stream),
then decoded by OpenCV. :func:`rgb_to_image_msg` and
:func:`rgb_to_compressed_msg` go the other way; :func:`to_model_image` resizes
to the model's square resolution (aspect kept, black padding, as the model was
trained).
"""

from __future__ import annotations

import array
from typing import Any

import cv2
import numpy as np
import simplejpeg
from cv_bridge import CvBridge, CvBridgeError
from sensor_msgs.msg import CompressedImage, Image

from .image_checks import (
    DEFAULT_MAX_IMAGE_BYTES,
    SUPPORTED_COMPRESSED_FORMATS,
    SUPPORTED_ENCODINGS,
    ImageError,
    check_compressed_msg,
    check_image_msg,
    check_png_data,
)
from .stamps import header_msg

# oxygen_ros.core.observation (resizing, the Observation dataclass) imports
# torch and transformers, seconds of start-up: it is imported where it is
# used, so that the nodes that only publish images (synthetic camera, bag
# player) start quickly.


def core_observation():
    from oxygen_ros.core import observation

    return observation


_bridge = CvBridge()


class _PackedImage:
    """What cv_bridge reads from an Image, with the row padding removed."""

    __slots__ = ("data", "encoding", "height", "is_bigendian", "step", "width")

    def __init__(self, height: int, width: int, encoding: str, data: bytes):
        self.height, self.width, self.encoding = height, width, encoding
        self.is_bigendian = 0  # 8-bit channels: byte order does not apply
        self.step = len(data) // height
        self.data = data


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


def _decode_jpeg(data: memoryview) -> np.ndarray:
    """JPEG data as RGB; ``damaged`` when it decodes only with decoder warnings."""
    try:
        return simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True)
    except ValueError as strict_error:
        try:  # does it decode at all? Then the data is damaged rather than unreadable.
            simplejpeg.decode_jpeg(data, colorspace="RGB", strict=False)
        except ValueError as exc:
            raise ImageError("corrupt_compressed", f"jpeg data does not decode: {exc}") from exc
        raise ImageError("damaged", f"jpeg data decodes only with errors ({strict_error}); "
                         "part of the image would be garbage") from strict_error


def _decode_png(data: memoryview, height: int, width: int) -> np.ndarray:
    """PNG data (checked intact first) as RGB."""
    check_png_data(data, height, width)
    decoded = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_UNCHANGED)
    if decoded is None or decoded.size == 0:
        raise ImageError("corrupt_compressed", f"png data ({len(data)} bytes) does not decode")
    if decoded.dtype != np.uint8:  # 16-bit PNG
        decoded = (decoded >> 8).astype(np.uint8)
    if decoded.ndim == 2:
        code = cv2.COLOR_GRAY2RGB
    elif decoded.shape[2] == 4:
        code = cv2.COLOR_BGRA2RGB
    elif decoded.shape[2] == 3:
        code = cv2.COLOR_BGR2RGB
    else:
        raise ImageError("corrupt_compressed", f"png decoded to an unexpected shape {decoded.shape}")
    return cv2.cvtColor(decoded, code)


def compressed_msg_to_rgb(msg: CompressedImage, max_bytes: int = DEFAULT_MAX_IMAGE_BYTES) -> np.ndarray:
    """A JPEG/PNG ``sensor_msgs/CompressedImage`` as a new ``HxWx3`` uint8 RGB array.

    Damaged data (see ``damaged`` in :data:`~.image_checks.IMAGE_ERROR_REASONS`)
    is refused rather than decoded to a partly garbage image."""
    fmt, height, width = check_compressed_msg(msg, max_bytes)
    data = memoryview(msg.data).cast("B")
    try:
        rgb = _decode_jpeg(data) if fmt == "jpeg" else _decode_png(data, height, width)
    except cv2.error as exc:
        raise ImageError("corrupt_compressed", f"{fmt} data does not decode: {exc}") from exc
    if rgb.shape[:2] != (height, width):
        raise ImageError(
            "corrupt_compressed", f"{fmt} decoded to {rgb.shape[1]}x{rgb.shape[0]}, header says {width}x{height}"
        )
    return np.ascontiguousarray(rgb)


def to_model_image(rgb: np.ndarray, size: int) -> np.ndarray:
    """Resize to ``size x size`` keeping the aspect ratio, padding with black."""
    return core_observation().resize_with_pad(rgb, int(size))



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
        header=header_msg(stamp, frame_id),
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
    msg = CompressedImage(header=header_msg(stamp, frame_id), format=fmt)
    msg.data = array.array("B", buf.tobytes())
    return msg

"""Checks of image messages before any decoder sees them, and the one error they raise.

Every way a ``sensor_msgs/Image`` or ``sensor_msgs/CompressedImage`` can be
malformed is checked explicitly (a compressed image's format and size are read
from its JPEG frame header / PNG IHDR chunk, so an oversized image is refused
before it is decoded), and reported as an :class:`ImageError` whose ``reason``
is one of :data:`IMAGE_ERROR_REASONS` (a short key, used for counters) and
whose message says what was wrong.
"""

from __future__ import annotations

from sensor_msgs.msg import CompressedImage, Image

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


class ImageError(ValueError):
    """An image message cannot be used; ``reason`` is one of :data:`IMAGE_ERROR_REASONS`."""

    def __init__(self, reason: str, detail: str):
        assert reason in IMAGE_ERROR_REASONS, reason
        super().__init__(f"{reason.replace('_', ' ')}: {detail}")
        self.reason = reason
        self.detail = detail


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

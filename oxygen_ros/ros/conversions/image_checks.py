"""Checks of image messages before any decoder sees them, and the one error they raise.

Every way a ``sensor_msgs/Image`` or ``sensor_msgs/CompressedImage`` can be
malformed is checked explicitly (a compressed image's format and size are read
from its JPEG frame header / PNG IHDR chunk, so an oversized image is refused
before it is decoded), and reported as an :class:`ImageError` whose ``reason``
is one of :data:`IMAGE_ERROR_REASONS` (a short key, used for counters) and
whose message says what was wrong. :func:`check_png_data` checks a PNG's
integrity (chunk CRCs, the zlib stream and the amount of image data), which
OpenCV's decoder does not fully do: a damaged stream whose CRC was fixed up can
decode, with a warning only, to a half-garbage image.
"""

from __future__ import annotations

import zlib

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
    "corrupt_compressed",  # JPEG/PNG data that does not decode (no header, truncated PNG chunks)
    "damaged",  # JPEG/PNG data that decodes only with errors: corrupt entropy-coded data, premature end,
    # bad Huffman code, extraneous bytes (JPEG); chunk CRC mismatch, bad zlib stream, wrong amount of data (PNG)
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


# PNG colour type -> channels (PNG spec, IHDR).
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
# Adam7 passes: (first column, first row, column step, row step).
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def _png_chunks(data: memoryview):
    """(type, offset) of every chunk up to IEND; ``corrupt_compressed`` when the chunk structure breaks."""
    i, n = 8, len(data)
    while True:
        if i + 12 > n:
            raise ImageError("corrupt_compressed", f"png data ends at byte {n} before its IEND chunk (truncated)")
        length, ctype = int.from_bytes(data[i:i + 4], "big"), bytes(data[i + 4:i + 8])
        if not ctype.isalpha() or length >= 1 << 31:
            raise ImageError("corrupt_compressed", f"png chunk structure broken at byte {i} (type {ctype!r})")
        if i + 12 + length > n:
            raise ImageError("corrupt_compressed", f"png {ctype.decode()} chunk at byte {i} runs past the end "
                             f"of the data ({n} bytes, truncated)")
        yield ctype, i
        if ctype == b"IEND":
            return
        i += 12 + length


def _png_raw_size(data: memoryview, height: int, width: int) -> int:
    """Bytes of filtered image data (filter byte + packed row, per row of every pass) that IHDR calls for."""
    if int.from_bytes(data[8:12], "big") != 13:
        raise ImageError("corrupt_compressed", "png IHDR chunk is not 13 bytes long")
    depth, color, interlace = data[24], data[25], data[28]
    if color not in _PNG_CHANNELS or depth not in (1, 2, 4, 8, 16) or interlace > 1:
        raise ImageError("corrupt_compressed", f"png IHDR has colour type {color}, bit depth {depth}, "
                         f"interlace {interlace}")
    bits = depth * _PNG_CHANNELS[color]
    passes = _ADAM7 if interlace else ((0, 0, 1, 1),)
    total = 0
    for x0, y0, dx, dy in passes:
        w, h = (width - x0 + dx - 1) // dx, (height - y0 + dy - 1) // dy
        if w > 0 and h > 0:
            total += h * (1 + (w * bits + 7) // 8)
    return total


def _inflated_size(parts: list[memoryview], limit: int) -> int:
    """Bytes the zlib stream split over ``parts`` inflates to (at most ``limit + 1`` are counted);
    ``damaged`` when the stream is bad, ends early or has data after its end."""
    stream, total, after = zlib.decompressobj(), 0, 0
    try:
        for part in parts:
            if stream.eof:
                after += len(part)
                continue
            pending = bytes(part)
            while pending and total <= limit and not stream.eof:
                total += len(stream.decompress(pending, 1 << 20))
                pending = stream.unconsumed_tail
    except zlib.error as exc:
        raise ImageError("damaged", f"png image data is not a valid zlib stream ({exc})") from exc
    if total > limit:
        return total
    if not stream.eof:
        raise ImageError("damaged", "png image data ends inside its zlib stream")
    if stream.unused_data or after:
        raise ImageError("damaged", f"png image data has {len(stream.unused_data) + after} bytes after its "
                         "zlib stream ends")
    return total


def check_png_data(data: memoryview, height: int, width: int) -> None:
    """Raise :class:`ImageError` unless the PNG ``data`` (whose IHDR says ``width`` x
    ``height``) is intact: every chunk's CRC matches, the IDAT data is one whole zlib
    stream (its Adler-32 checked) and inflates to exactly what IHDR calls for."""
    idat = []
    for ctype, i in _png_chunks(data):
        end = i + 8 + int.from_bytes(data[i:i + 4], "big")
        if zlib.crc32(data[i + 4:end]) != int.from_bytes(data[end:end + 4], "big"):
            raise ImageError("damaged", f"png {ctype.decode()} chunk at byte {i}: CRC mismatch")
        if ctype == b"IDAT":
            idat.append(data[i + 8:end])
    if not idat:
        raise ImageError("corrupt_compressed", "png data has no IDAT chunk")
    expected = _png_raw_size(data, height, width)  # IHDR: the first chunk, whole (checked above)
    size = _inflated_size(idat, expected)
    if size != expected:
        more = "more than" if size > expected else "only"
        raise ImageError("damaged", f"png image data inflates to {more} {size} bytes, IHDR ({width}x{height}) "
                         f"calls for {expected}")

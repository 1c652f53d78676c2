"""Tests of oxygen_ros.ros.conversions' images: raw and compressed messages to RGB arrays, checks and resizing.

No middleware is needed: messages are built, serialized and deserialized
in-process (rclpy.serialization works without rclpy.init).
"""

from collections import Counter

import cv2
import numpy as np
import pytest
from builtin_interfaces.msg import Time
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rclpy.serialization import deserialize_message, serialize_message
from sensor_msgs.msg import CompressedImage, Image

from message_builders import compressed_image, png_with_size, raw_image

from oxygen_ros.ros import conversions as conv
from oxygen_ros.ros.conversions import ImageError


def _rgb(h, w, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _smooth_rgb(h, w):
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x + y) * 127 // max(h + w - 2, 1)],
                    axis=-1).astype(np.uint8)


def _png_bytes(rgb):
    return cv2.imencode(".png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))[1].tobytes()


# --------------------------------------------------------------------------
# raw images
# --------------------------------------------------------------------------

@pytest.mark.parametrize("encoding", sorted(conv.SUPPORTED_ENCODINGS))
def test_raw_round_trip(encoding):
    rgb = _rgb(7, 11)
    msg = conv.rgb_to_image_msg(rgb, encoding, stamp=12.5, frame_id="cam")
    assert msg.encoding == encoding and msg.height == 7 and msg.width == 11
    assert msg.step == 11 * conv.SUPPORTED_ENCODINGS[encoding]
    assert msg.header.stamp == Time(sec=12, nanosec=500_000_000) and msg.header.frame_id == "cam"
    # through the wire format as well
    back = conv.image_msg_to_rgb(deserialize_message(serialize_message(msg), Image))
    assert back.dtype == np.uint8 and back.shape == (7, 11, 3) and back.flags.c_contiguous
    if encoding == "mono8":
        gray = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
        assert np.array_equal(back, np.repeat(gray[..., None], 3, axis=2))
    else:
        assert np.array_equal(back, rgb)


@pytest.mark.parametrize("encoding", ["bgr8", "mono8", "rgba8"])
def test_padded_rows_and_endianness_flag(encoding):
    """Row padding (step > width * channels) is removed; the big-endian flag
    does not matter for 8-bit data (and must not crash cv_bridge)."""
    rgb = _rgb(5, 6, seed=3)
    packed = conv.rgb_to_image_msg(rgb, encoding)
    row = packed.step
    padded_rows = np.zeros((5, row + 7), np.uint8)
    padded_rows[:, :row] = np.frombuffer(packed.data, np.uint8).reshape(5, row)
    padded_rows[:, row:] = 99  # garbage in the padding
    msg = raw_image(encoding, 5, 6, step=row + 7, data=padded_rows.tobytes(), is_bigendian=1)
    assert np.array_equal(conv.image_msg_to_rgb(msg), conv.image_msg_to_rgb(packed))


def test_result_owns_its_memory():
    msg = conv.rgb_to_image_msg(_rgb(3, 3))
    out = conv.image_msg_to_rgb(msg)
    out[:] = 0
    assert conv.image_msg_to_rgb(msg).any()


@pytest.mark.parametrize(
    "msg, reason",
    [
        (raw_image("yuv422"), "unsupported_encoding"),
        (raw_image("rgb16"), "unsupported_encoding"),
        (raw_image("bayer_rggb8"), "unsupported_encoding"),
        (raw_image(""), "unsupported_encoding"),
        (raw_image("rgb8", height=0, width=5, data=b""), "zero_size"),
        (raw_image("rgb8", height=4, width=0, step=0, data=b"\0" * 12), "zero_size"),
        (raw_image("rgb8", data=b""), "empty_data"),
        (raw_image("rgb8", height=4, width=5, step=14), "bad_step"),
        (raw_image("rgb8", height=4, width=5, data=bytes(59)), "size_mismatch"),
        (raw_image("rgb8", height=4, width=5, data=bytes(61)), "size_mismatch"),
        (raw_image("mono8", height=4, width=5, step=5, data=bytes(4 * 15)), "size_mismatch"),
        (raw_image("rgb8", height=100_000, width=100_000, data=bytes(30)), "too_large"),
        (raw_image("rgb8", height=2**32 - 1, width=2**32 - 1, step=2**32 - 1, data=bytes(3)), "too_large"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_bad_raw_images_rejected_with_reason(msg, reason):
    with pytest.raises(ImageError) as info:
        conv.image_msg_to_rgb(msg)
    assert info.value.reason == reason
    assert isinstance(info.value, ValueError)
    assert reason.replace("_", " ") in str(info.value)


def test_size_limit_is_a_parameter():
    msg = conv.rgb_to_image_msg(_rgb(10, 10))  # 300 bytes
    conv.image_msg_to_rgb(msg, max_bytes=300)
    with pytest.raises(ImageError, match="limit 299") as info:
        conv.image_msg_to_rgb(msg, max_bytes=299)
    assert info.value.reason == "too_large"
    mono = conv.rgb_to_image_msg(_rgb(10, 10), "mono8")  # 100 bytes, but 300 decoded
    with pytest.raises(ImageError) as info:
        conv.image_msg_to_rgb(mono, max_bytes=299)
    assert info.value.reason == "too_large"


_OTHER_ENCODINGS = ["yuv422", "rgb16", "16UC1", "32FC1", "8UC3", "bayer_rggb8", "", "RGB8", "rgb8 ", "jpeg"]
_DIM = st.one_of(st.integers(0, 24), st.sampled_from([2**32 - 1, 2**31, 65536, 100_000]))


@st.composite
def _fuzz_images(draw):
    pick = draw(st.integers(0, 9))  # mostly supported encodings, so that the other checks are reached
    if pick < 7:
        encoding = draw(st.sampled_from(sorted(conv.SUPPORTED_ENCODINGS)))
    else:
        encoding = draw(st.one_of(st.sampled_from(_OTHER_ENCODINGS), st.text(max_size=8)))
    height, width = draw(_DIM), draw(_DIM)
    channels = conv.SUPPORTED_ENCODINGS.get(encoding, draw(st.integers(1, 4)))
    row = width * channels
    step = draw(st.one_of(st.just(row), st.integers(0, 128), st.integers(row, row + 16).filter(lambda s: s < 2**32),
                          st.just(2**32 - 1)).filter(lambda s: s < 2**32))
    natural = height * step
    size = draw(st.one_of(st.just(natural), st.integers(0, 4096),
                          st.integers(max(0, natural - 3), natural + 3)).filter(lambda n: n <= 8192))
    is_bigendian = draw(st.sampled_from([0, 1, 255]))
    max_bytes = draw(st.sampled_from([conv.DEFAULT_MAX_IMAGE_BYTES, 4096, 100]))
    return encoding, height, width, step, size, is_bigendian, max_bytes


def test_fuzz_raw_images_only_image_error_escapes(capsys, record_property):
    outcomes = Counter()
    covered = Counter()  # what the cases exercised: encodings, sizes, data lengths, steps

    @settings(max_examples=600, deadline=None, database=None,
              suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
    @given(_fuzz_images(), st.randoms(use_true_random=False))
    def run(case, rnd):
        encoding, height, width, step, size, is_bigendian, max_bytes = case
        msg = Image(height=height, width=width, encoding=encoding, step=step, is_bigendian=is_bigendian)
        msg.data = rnd.randbytes(size)
        channels = conv.SUPPORTED_ENCODINGS.get(encoding)
        covered["encoding " + (encoding if channels else "unsupported")] += 1
        covered["size zero" if 0 in (height, width) else "size huge" if max(height, width) >= 65536
                else "size small"] += 1
        covered["data natural" if size == height * step else "data empty" if size == 0 else "data other"] += 1
        if channels:
            row = width * channels
            covered["step packed" if step == row else "step short" if step < row else "step padded"] += 1
        try:
            out = conv.image_msg_to_rgb(msg, max_bytes=max_bytes)
        except ImageError as exc:
            assert exc.reason in conv.IMAGE_ERROR_REASONS
            outcomes[exc.reason] += 1
        else:
            assert out.dtype == np.uint8 and out.shape == (height, width, 3)
            outcomes["ok"] += 1

    run()
    cases = sum(outcomes.values())
    record_property("fuzz_cases", cases)
    record_property("fuzz_outcomes", dict(sorted(outcomes.items())))
    with capsys.disabled():
        print(f"\n  fuzzed raw images: {cases} cases {dict(sorted(outcomes.items()))}"
              f"\n    covering {dict(sorted(covered.items()))}")
    assert cases >= 300
    assert outcomes["ok"] > 0
    compressed_only = {"unsupported_format", "corrupt_compressed", "damaged", "conversion_failed"}
    assert set(conv.IMAGE_ERROR_REASONS) - compressed_only <= set(outcomes), outcomes  # every raw-image reason
    assert {f"encoding {e}" for e in conv.SUPPORTED_ENCODINGS} | {"encoding unsupported"} <= set(covered)
    assert {"size zero", "size huge", "size small", "data natural", "data empty", "data other", "step packed",
            "step short", "step padded"} <= set(covered), covered


# --------------------------------------------------------------------------
# compressed images
# --------------------------------------------------------------------------

def test_png_round_trip_is_exact():
    rgb = _rgb(9, 13, seed=5)
    msg = conv.rgb_to_compressed_msg(rgb, "png", stamp=1.0, frame_id="wrist")
    assert msg.format == "png" and msg.header.frame_id == "wrist"
    assert np.array_equal(conv.compressed_msg_to_rgb(deserialize_message(serialize_message(msg), CompressedImage)),
                          rgb)


def test_jpeg_round_trip_is_close():
    rgb = _smooth_rgb(48, 64)
    msg = conv.rgb_to_compressed_msg(rgb, "jpeg", quality=95)
    assert conv.check_compressed_msg(msg) == ("jpeg", 48, 64)
    back = conv.compressed_msg_to_rgb(msg)
    assert back.shape == (48, 64, 3)
    assert np.abs(back.astype(int) - rgb).mean() < 3.0


def test_gray_and_alpha_png_and_format_field_ignored():
    gray = np.arange(30, dtype=np.uint8).reshape(5, 6)
    msg = compressed_image(cv2.imencode(".png", gray)[1].tobytes(), fmt="mono8; png compressed")
    assert np.array_equal(conv.compressed_msg_to_rgb(msg), np.repeat(gray[..., None], 3, axis=2))
    bgra = np.dstack([_rgb(5, 6)[..., ::-1], np.full((5, 6), 7, np.uint8)])
    msg = compressed_image(cv2.imencode(".png", bgra)[1].tobytes(), fmt="bgra8; png compressed")
    assert np.array_equal(conv.compressed_msg_to_rgb(msg), bgra[..., 2::-1])
    msg = compressed_image(_png_bytes(_rgb(4, 4)), fmt="jpeg")  # wrong format field: the data decides
    assert conv.compressed_msg_to_rgb(msg).shape == (4, 4, 3)


def _jpeg_bytes():
    return conv.rgb_to_compressed_msg(_smooth_rgb(32, 32), "jpeg").data.tobytes()


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"", "empty_data"),
        (b"GIF89a" + bytes(40), "unsupported_format"),
        (bytes(100), "unsupported_format"),
        (b"\x89PNG\r\n\x1a\n", "corrupt_compressed"),  # no IHDR
        (_png_bytes(_rgb(8, 8))[:40], "corrupt_compressed"),  # truncated
        (_png_bytes(_rgb(8, 8))[:33] + bytes(60), "corrupt_compressed"),  # garbage after IHDR
        (png_with_size(0, 10), "zero_size"),
        (png_with_size(100_000, 100_000), "too_large"),  # refused before decoding
        (b"\xff\xd8\xff\xd9", "corrupt_compressed"),  # SOI EOI, no frame
        (b"\xff\xd8\xff\xe0\x00\x10" + bytes(200), "corrupt_compressed"),  # no frame header
        (_jpeg_bytes()[:200], "corrupt_compressed"),  # header ok, scan cut short
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_corrupt_compressed_rejected_with_reason(data, reason):
    with pytest.raises(ImageError) as info:
        conv.compressed_msg_to_rgb(compressed_image(data))
    assert info.value.reason == reason


def test_compressed_size_limit():
    msg = conv.rgb_to_compressed_msg(_smooth_rgb(20, 20), "png")
    assert len(msg.data) < 1200
    assert conv.compressed_msg_to_rgb(msg, max_bytes=1200).shape == (20, 20, 3)
    with pytest.raises(ImageError) as info:
        conv.compressed_msg_to_rgb(msg, max_bytes=1199)  # decodes to 1200 bytes
    assert info.value.reason == "too_large"
    with pytest.raises(ImageError) as info:
        conv.compressed_msg_to_rgb(msg, max_bytes=len(msg.data) - 1)
    assert info.value.reason == "too_large"


def test_fuzz_compressed_only_image_error_escapes(capsys, record_property):
    outcomes = Counter()
    seeds = [_png_bytes(_rgb(6, 5)), _jpeg_bytes(), b""]

    @settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.sampled_from(seeds), st.integers(0, 2000), st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 255)),
                                                                  max_size=6), st.binary(max_size=64))
    def run(seed, cut, flips, tail):
        data = bytearray(seed[:cut] + tail)
        for pos, value in flips:
            if pos < len(data):
                data[pos] = value
        try:
            out = conv.compressed_msg_to_rgb(compressed_image(bytes(data)))
        except ImageError as exc:
            outcomes[exc.reason] += 1
        else:
            assert out.dtype == np.uint8 and out.ndim == 3 and out.shape[2] == 3
            outcomes["ok"] += 1

    run()
    record_property("fuzz_cases", sum(outcomes.values()))
    with capsys.disabled():
        print(f"\n  fuzzed compressed images: {sum(outcomes.values())} cases {dict(sorted(outcomes.items()))}")
    assert outcomes["ok"] > 0 and outcomes["corrupt_compressed"] > 0


# --------------------------------------------------------------------------
# resizing
# --------------------------------------------------------------------------

def test_to_model_image_keeps_aspect_with_black_padding():
    wide = np.full((20, 40, 3), 200, np.uint8)
    out = conv.to_model_image(wide, 32)
    assert out.shape == (32, 32, 3)
    assert (out[:8] == 0).all() and (out[24:] == 0).all() and (out[8:24] == 200).all()
    tall = np.full((40, 10, 3), 50, np.uint8)
    out = conv.to_model_image(tall, 16)
    assert (out[:, :6] == 0).all() and (out[:, 10:] == 0).all() and (out[:, 6:10] == 50).all()

"""Compressed images damaged inside their data are refused (reason ``damaged``), not decoded
to a partly garbage image; intact ones of every kind still decode.

The damaged files keep their structure (markers, chunk lengths, often the CRCs): the
damage is in the compressed data itself, where OpenCV's decoder only warns on stderr and
returns an image. No middleware is needed.
"""

import cv2
import numpy as np
import pytest
import simplejpeg
from message_builders import compressed_image, jpeg_with_scan_changed, png_file, png_with_idat_changed

from oxygen_ros.ros import conversions as conv
from oxygen_ros.ros.conversions import ImageError


def _scene(h, w, seed=0):
    """A gradient with some texture, as a camera sees it."""
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 // (w - 1), y * 255 // (h - 1), (x + y) * 127 // (h + w - 2)], axis=-1)
    noise = np.random.default_rng(seed).integers(0, 24, (h, w, 3))
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def _jpeg(rgb, quality=90):
    return bytes(conv.rgb_to_compressed_msg(rgb, "jpeg", quality=quality).data)


def _refused(data: bytes) -> ImageError:
    with pytest.raises(ImageError) as info:
        conv.compressed_msg_to_rgb(compressed_image(data, fmt="jpeg"))
    return info.value


def _opencv(data: bytes):
    """What OpenCV's decoder makes of ``data`` (RGB), or None."""
    out = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    return None if out is None else out[..., ::-1]


# --------------------------------------------------------------------------
# JPEG
# --------------------------------------------------------------------------

@pytest.mark.parametrize("size, quality", [((32, 40), 75), ((48, 64), 95), ((240, 320), 90)])
def test_jpeg_with_bytes_changed_inside_its_scan_is_refused(size, quality):
    rgb = _scene(*size)
    damaged = jpeg_with_scan_changed(_jpeg(rgb, quality))
    seen = _opencv(damaged)
    assert seen is not None and seen.shape == rgb.shape  # OpenCV hands it on, damaged
    error = _refused(damaged)
    assert error.reason == "damaged"
    assert "jpeg" in str(error) and "Corrupt JPEG data" in str(error)


def test_jpeg_with_junk_in_its_scan_or_cut_inside_it_is_refused():
    jpeg = _jpeg(_scene(48, 64))
    junk_before_end = jpeg[:-2] + bytes(range(1, 40)) + jpeg[-2:]  # extraneous bytes before EOI
    cut_in_scan = jpeg[:len(jpeg) * 3 // 4] + b"\xff\xd9"  # premature end of the scan
    for data, says in ((junk_before_end, "extraneous bytes"), (cut_in_scan, "premature end")):
        assert _opencv(data) is not None
        error = _refused(data)
        assert error.reason == "damaged" and says in str(error), str(error)


def test_intact_jpeg_of_every_kind_decodes_as_opencv_decodes_it():
    rgb = _scene(40, 56)
    bgr = np.ascontiguousarray(rgb[..., ::-1])
    kinds = {
        "baseline": _jpeg(rgb),
        "progressive": cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])[1].tobytes(),
        "gray": cv2.imencode(".jpg", bgr[..., 0])[1].tobytes(),
        "4:2:0": cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_SAMPLING_FACTOR,
                                            cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420])[1].tobytes(),
        "cmyk": simplejpeg.encode_jpeg(np.ascontiguousarray(np.dstack([rgb, rgb[..., :1]])), colorspace="CMYK"),
    }
    for kind, data in kinds.items():
        out = conv.compressed_msg_to_rgb(compressed_image(data, fmt="jpeg"))
        assert out.dtype == np.uint8 and out.shape == rgb.shape, kind
        assert np.array_equal(out, _opencv(data)), kind


# --------------------------------------------------------------------------
# PNG
# --------------------------------------------------------------------------

def _png_cases():
    rgb = _scene(24, 30)
    return rgb, {
        # a changed byte in IDAT, its CRC left as it was
        "crc_mismatch": (png_with_idat_changed(png_file(rgb)), "CRC mismatch"),
        # a changed pixel byte, the chunk's CRC fixed up: only the zlib checksum tells
        "zlib_damaged_crc_fixed": (png_with_idat_changed(png_file(rgb, level=0, checksum_apart=True),
                                                         fix_crc=True), "zlib"),
        "deflate_damaged_crc_fixed": (png_with_idat_changed(png_file(rgb), fix_crc=True), "zlib"),
        "rows_missing": (png_file(rgb, extra_rows=-2), "inflates to only"),
        "rows_extra": (png_file(rgb, extra_rows=2), "inflates to more than"),
        "data_after_stream": (png_file(rgb, trailing=b"\x00\x01\x02"), "after its zlib stream"),
    }


@pytest.mark.parametrize("case", list(_png_cases()[1]))
def test_png_damaged_inside_its_image_data_is_refused(case):
    rgb, cases = _png_cases()
    data, says = cases[case]
    error = _refused(data)
    assert error.reason == "damaged" and "png" in str(error) and says in str(error), str(error)


def test_png_whose_damage_opencv_misses_is_refused():
    """The case that matters: OpenCV decodes it, with a warning only, to a wrong image."""
    rgb, cases = _png_cases()
    for case in ("zlib_damaged_crc_fixed", "rows_extra", "data_after_stream"):
        data = cases[case][0]
        assert _opencv(data) is not None, case
        assert _refused(data).reason == "damaged", case
    wrong = _opencv(cases["zlib_damaged_crc_fixed"][0])
    assert not np.array_equal(wrong, rgb)


@pytest.mark.parametrize("layout", [
    {}, {"level": 0}, {"interlaced": True}, {"idat_chunks": 3}, {"checksum_apart": True},
    {"interlaced": True, "idat_chunks": 4, "checksum_apart": True, "level": 0},
], ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "plain")
def test_intact_png_of_every_layout_decodes_exactly(layout):
    rgb = _scene(23, 29)  # not a multiple of 8: every Adam7 pass has a ragged edge
    assert np.array_equal(conv.compressed_msg_to_rgb(compressed_image(png_file(rgb, **layout))), rgb)
    tiny = _scene(3, 2)  # some Adam7 passes are empty
    assert np.array_equal(conv.compressed_msg_to_rgb(compressed_image(png_file(tiny, **layout))), tiny)


def test_truncated_png_is_still_corrupt_not_damaged():
    """A PNG whose chunks run past the data's end cannot be decoded at all: ``corrupt_compressed``."""
    data = png_file(_scene(24, 30))
    for cut in (40, len(data) // 2, len(data) - 6):
        assert _refused(data[:cut]).reason == "corrupt_compressed"

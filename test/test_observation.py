"""Observation validation and model-input building."""

import numpy as np
import pytest
import torch

from oxygen_ros.core.model.config import TINY
from oxygen_ros.core.observation import (
    Observation,
    ObservationError,
    make_prefix_batch,
    resize_with_pad,
)


def img(h=32, w=32, value=10):
    return np.full((h, w, 3), value, dtype=np.uint8)


@pytest.mark.parametrize(
    "kwargs, field, words",
    [
        (dict(images={}), "images", "at least one camera"),
        (dict(images={"cam": img().astype(np.float32)}), "images['cam']", "uint8"),
        (dict(images={"cam": np.zeros((32, 32), np.uint8)}), "images['cam']", "HxWx3"),
        (dict(images={"cam": np.zeros((32, 32, 4), np.uint8)}), "images['cam']", "HxWx3"),
        (dict(images={"cam": np.zeros((0, 32, 3), np.uint8)}), "images['cam']", "empty"),
        (dict(images={"cam": [[1, 2, 3]]}), "images['cam']", "numpy array"),
        (dict(instruction=None), "instruction", "string"),
        (dict(state=np.array([0.1, np.nan])), "state", "NaN"),
        (dict(state=np.array([0.1, np.inf])), "state", "infinite"),
        (dict(state=np.zeros((2, 2))), "state", "1-D"),
        (dict(state=np.zeros(33)), "state", "at most 32"),
    ],
)
def test_bad_observations_name_the_field(kwargs, field, words):
    args = dict(images={"cam": img()}, instruction="pick up the cup", state=None) | kwargs
    with pytest.raises(ObservationError) as err:
        Observation(**args)
    assert err.value.field == field
    assert words in str(err.value) and f"observation.{field}" in str(err.value)


def test_too_many_cameras_is_rejected_when_batching(tok):
    obs = Observation({f"c{i}": img() for i in range(4)}, "go")
    with pytest.raises(ObservationError, match="at most 3"):
        make_prefix_batch([obs], tok, TINY)


def test_unknown_camera_name_is_rejected(tok):
    obs = Observation({"wrist": img()}, "go")
    with pytest.raises(ObservationError, match="unknown camera"):
        make_prefix_batch([obs], tok, TINY, camera_names=["base", "left"])


def test_resize_keeps_aspect_with_black_padding():
    wide = np.full((20, 80, 3), 200, np.uint8)
    out = resize_with_pad(wide, 32)
    assert out.shape == (32, 32, 3) and out.dtype == np.uint8
    assert (out[:8] == 0).all() and (out[-8:] == 0).all()  # 80x20 -> 32x8 centred
    assert (out[12:20] == 200).all()


def test_resize_truncates_sides_as_openpi_does():
    """openpi's resize_with_pad: ratio = max(w / size, h / size), sides int(side / ratio), the
    padding's odd row after: 848x480 -> 224x126 from row 49 (rounding gave 127 rows from 48)."""
    out = resize_with_pad(np.full((480, 848, 3), 200, np.uint8), 224)
    rows = np.flatnonzero(out[:, 112, 0])
    assert (rows[0], rows[-1]) == (49, 174)  # 126 rows: (224 - 126) // 2 = 49 above, 49 below


def test_prefix_batch_places_cameras_by_name_and_masks_missing_ones(tok):
    a = Observation({"base": img(value=255), "wrist": img(64, 48, 0)}, "move to the red circle", np.array([0.5, -0.5]))
    b = Observation({"wrist": img(value=128)}, "open the gripper")
    batch = make_prefix_batch([a, b], tok, TINY, camera_names=["base", "wrist", "side"])
    assert batch.pixels.shape == (2, 3, 3, TINY.vision.image_size, TINY.vision.image_size)
    assert batch.image_mask.tolist() == [[True, True, False], [False, True, False]]
    assert batch.pixels.dtype == torch.uint8  # the camera's bytes: the model normalises them
    assert (batch.pixels[0, 0] == 255).all() and (batch.pixels[1, 1] == 128).all()
    assert (batch.pixels[1, 0] == 0).all() and (batch.pixels[:, 2] == 0).all()  # absent: black
    n_a = int(batch.token_mask[0].sum())
    assert batch.prompt_lengths == (n_a, int(batch.token_mask[1].sum()))
    text = tok.decode(batch.tokens[0, :n_a].tolist())
    assert text.startswith("Task: move to the red circle, State: ") and text.endswith(";\nAction: ")
    assert (batch.tokens[0, n_a:] == tok.pad_id).all()


def test_resize_antialiases_when_it_shrinks():
    """A 640x480 camera of alternating black and white columns shrunk to 224 is a nearly flat
    grey band (each output pixel averages about three columns); without antialiasing the
    bilinear sample keeps stripes (std about 73) that the model would see as a pattern."""
    stripes = np.zeros((480, 640, 3), np.uint8)
    stripes[:, ::2] = 255
    out = resize_with_pad(stripes, 224)
    band = out[28:196]  # 640x480 -> 224x168 from row 28
    assert band.std() < 20, band.std()
    assert abs(float(band.mean()) - 127.5) < 10

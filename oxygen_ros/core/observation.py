"""What the robot sees and is told at one instant, checked before it reaches the model.

An :class:`Observation` holds uint8 RGB images per camera, the instruction and
an optional state vector. Construction validates every field and raises
:class:`ObservationError` naming the field. :func:`make_prefix_batch` turns a
list of observations into model inputs: images resized (aspect kept, black
padding, as π0.5) to the model's resolution in a fixed camera order, and the
π0.5 prompt tokenised and padded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from .model.config import ModelConfig
from .model.vla import PrefixBatch
from .tokenizer import Tokenizer, fitted_prompt_ids

MAX_STATE_DIM = 32


class ObservationError(ValueError):
    """An observation field is malformed; ``field`` names it."""

    def __init__(self, field_name: str, reason: str):
        super().__init__(f"observation.{field_name}: {reason}")
        self.field = field_name
        self.reason = reason


@dataclass(frozen=True)
class Observation:
    images: Mapping[str, np.ndarray]
    instruction: str
    state: np.ndarray | None = None
    stamp: float = 0.0  # capture time in seconds (monotonic or ROS time); informational
    meta: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.images, Mapping) or not self.images:
            raise ObservationError("images", "needs at least one camera image (a mapping name -> HxWx3 uint8)")
        for name, img in self.images.items():
            where = f"images[{name!r}]"
            if not isinstance(name, str) or not name:
                raise ObservationError("images", f"camera names must be non-empty strings, got {name!r}")
            if not isinstance(img, np.ndarray):
                raise ObservationError(where, f"must be a numpy array, got {type(img).__name__}")
            if img.dtype != np.uint8:
                raise ObservationError(where, f"dtype must be uint8, got {img.dtype}")
            if img.ndim != 3 or img.shape[2] != 3:
                raise ObservationError(where, f"shape must be HxWx3 (RGB), got {img.shape}")
            if img.shape[0] == 0 or img.shape[1] == 0:
                raise ObservationError(where, f"image is empty: shape {img.shape}")
        if not isinstance(self.instruction, str):
            raise ObservationError("instruction", f"must be a string, got {type(self.instruction).__name__}")
        if self.state is not None:
            state = np.asarray(self.state)
            if state.ndim != 1:
                raise ObservationError("state", f"must be a 1-D vector, got shape {state.shape}")
            if not np.issubdtype(state.dtype, np.number):
                raise ObservationError("state", f"must be numeric, got dtype {state.dtype}")
            if state.shape[0] > MAX_STATE_DIM:
                raise ObservationError("state", f"has {state.shape[0]} values, at most {MAX_STATE_DIM} are supported")
            if not np.all(np.isfinite(state)):
                raise ObservationError("state", "contains NaN or infinite values")
            object.__setattr__(self, "state", state.astype(np.float32))

    def check_cameras(self, max_cameras: int, camera_names: Sequence[str] | None = None) -> None:
        """Raise if there are more cameras than the model takes, or unknown names."""
        if len(self.images) > max_cameras:
            raise ObservationError("images", f"{len(self.images)} cameras given, at most {max_cameras} are taken "
                                             "(the model's camera slots, or max_cameras where it is set lower)")
        if camera_names is not None:
            unknown = [n for n in self.images if n not in camera_names]
            if unknown:
                raise ObservationError("images", f"unknown camera(s) {unknown}; expected some of {list(camera_names)}")


def resize_with_pad(image: np.ndarray, size: int) -> np.ndarray:
    """Resize keeping the aspect ratio into a size x size black canvas (uint8 RGB). The resized
    sides are truncated and the padding split (the odd pixel after) as openpi's
    ``resize_with_pad`` does: an 848x480 camera gives 126 rows there, not 127."""
    h, w, _ = image.shape
    if (h, w) == (size, size):
        return image
    ratio = max(w / size, h / size)
    scale = 1.0 / ratio
    nh, nw = max(1, int(h / ratio)), max(1, int(w / ratio))
    x = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)[None].float()
    x = F.interpolate(x, size=(nh, nw), mode="bilinear", align_corners=False, antialias=scale < 1.0)
    out = np.zeros((size, size, 3), dtype=np.uint8)
    top, left = (size - nh) // 2, (size - nw) // 2
    out[top : top + nh, left : left + nw] = x[0].permute(1, 2, 0).round().clamp(0, 255).byte().numpy()
    return out


def make_prefix_batch(
    observations: Sequence[Observation],
    tokenizer: Tokenizer,
    config: ModelConfig,
    camera_names: Sequence[str] | None = None,
    max_token_len: int | None = None,
) -> PrefixBatch:
    """Stack observations into model inputs.

    Cameras are placed in the order of ``camera_names`` (default: each
    observation's own order); a camera an observation lacks is a black image
    with its mask off, so it is never attended.
    """
    if not observations:
        raise ValueError("make_prefix_batch needs at least one observation")
    size, cams = config.vision.image_size, config.max_cameras
    max_len = max_token_len or config.max_token_len
    pixels = np.zeros((len(observations), cams, 3, size, size), dtype=np.uint8)  # colour planes
    image_mask = np.zeros((len(observations), cams), dtype=bool)
    tokens = np.full((len(observations), max_len), tokenizer.pad_id, dtype=np.int64)  # right-padded
    token_mask = np.zeros((len(observations), max_len), dtype=bool)
    prompt_lengths = []
    for b, obs in enumerate(observations):
        obs.check_cameras(cams, camera_names)
        names = list(camera_names) if camera_names is not None else list(obs.images)
        for c, name in enumerate(names[:cams]):
            if name in obs.images:
                pixels[b, c] = resize_with_pad(obs.images[name], size).transpose(2, 0, 1)
                image_mask[b, c] = True
        ids = fitted_prompt_ids(tokenizer, obs.instruction, obs.state, max_len)
        tokens[b, : len(ids)], token_mask[b, : len(ids)] = ids, True
        prompt_lengths.append(len(ids))
    return PrefixBatch(
        pixels=torch.from_numpy(pixels),  # uint8: the model normalises them (in its graph, compiled)
        image_mask=torch.from_numpy(image_mask),
        tokens=torch.from_numpy(tokens),
        token_mask=torch.from_numpy(token_mask),
        prompt_lengths=tuple(prompt_lengths),
    )


def prefix_tokens(config: ModelConfig, max_token_len: int | None = None) -> int:
    """Upper bound of a prefix's length in tokens (all cameras + prompt)."""
    return config.image_tokens + (max_token_len or config.max_token_len)


__all__ = ["Observation", "ObservationError", "make_prefix_batch", "resize_with_pad", "prefix_tokens"]

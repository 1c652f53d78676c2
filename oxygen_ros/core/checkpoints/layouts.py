"""Checkpoint layouts: how one is recognised, its model config, and its key map.

A layout turns the checkpoint's tensor names into our names (``KeyPlan``);
``loading.py`` then checks every name and shape against the model before
anything is read. See ``docs/checkpoints.md`` for the layouts themselves.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..model.config import ModelConfig
from .errors import CheckpointError
from .native import is_native_dir, read_native_config
from .safetensors_files import TensorInfo

Tensors = Mapping[str, TensorInfo]


@dataclass
class KeyPlan:
    """``mapping``: our key -> checkpoint key; ``ignored``: checkpoint keys known
    and deliberately unused (with the reason); ``problems``: findings of the
    layout itself (duplicates...), reported together with the shape check."""

    mapping: dict[str, str] = field(default_factory=dict)
    ignored: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


class Layout:
    name: str = ""

    def config(self, directory: pathlib.Path, tensors: Tensors) -> ModelConfig:
        raise NotImplementedError

    def key_map(self, tensors: Tensors, config: ModelConfig) -> KeyPlan:
        raise NotImplementedError


class NativeLayout(Layout):
    """Our own names (``save_native``); the config is in ``config.json``."""

    name = "native"

    def config(self, directory, tensors):
        return read_native_config(directory)[0]

    def key_map(self, tensors, config):
        return KeyPlan(mapping={k: k for k in tensors})


def detect(directory: pathlib.Path, tensors: Tensors) -> Layout:
    """The layout of a checkpoint, from its config.json marker and its tensor names."""
    if is_native_dir(directory):
        return NativeLayout()
    sample = sorted(tensors)[:5]
    raise CheckpointError(
        f"{directory}: unrecognised checkpoint layout (not native, openpi-PyTorch or LeRobot pi05); "
        f"first tensor names: {sample}"
    )

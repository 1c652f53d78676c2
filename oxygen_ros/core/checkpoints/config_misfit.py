"""A foreign checkpoint whose config.json states sizes its tensors do not have (a converter
fork that writes the robot's ``action_dim`` 7 where the tensors are 32 wide): the misfit list
blamed the tensors. :func:`config_misfit_hint` names the sizes config.json gets wrong and the
option that overrides them, when a model of the tensors' own sizes fits every tensor."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

from ..model.config import ModelConfig
from .given_sizes import PART_FIELDS, TOP_FIELDS
from .sizes import DEFAULTS, infer_config


def flat_sizes(config: ModelConfig) -> dict[str, int]:
    """Every size of ``config`` the tensor shapes decide, under its flat key (``vlm.width``)."""
    out = {key: getattr(config, key) for key in TOP_FIELDS if key not in DEFAULTS}
    for part, names in PART_FIELDS.items():
        out |= {f"{part}.{name}": getattr(getattr(config, part), name) for name in names}
    return out


def config_misfit_hint(directory: pathlib.Path, layout: str, shapes: Mapping[str, tuple[int, ...]],
                       config: ModelConfig, sizes: Mapping[str, Any],
                       fits: Callable[[ModelConfig], bool]) -> str | None:
    """The line to add to a misfit error of ``config`` (built from config.json): the sizes that
    differ from those of the tensors (``shapes``, our names) and how to give them, when a model
    of the tensors' sizes (and the given ``sizes``) ``fits``; None otherwise."""
    if layout not in ("openpi", "lerobot") or not (directory / "config.json").is_file():
        return None
    try:
        shaped = infer_config(shapes, name=config.name, sizes=sizes)
    except ValueError:  # CheckpointError and SizesError too: the shapes alone say too little
        return None
    stated, own = flat_sizes(config), flat_sizes(shaped)
    differ = {key: value for key, value in own.items() if stated.get(key) != value}
    if not differ or not fits(shaped):
        return None
    said = ", ".join(f"{key} {stated.get(key)} (the tensors: {value})" for key, value in differ.items())
    items = [f"{key}={value}" for key, value in differ.items()]
    return (f"config.json states sizes the tensors do not have: {said}. The tensors fit their own sizes: give them "
            f"to override config.json, --size {' --size '.join(items)} on a command, model_sizes: "
            f"{json.dumps(items)} on the inference node")

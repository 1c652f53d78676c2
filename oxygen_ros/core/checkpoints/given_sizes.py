"""Explicit model sizes: the ``oxygen_sizes`` object of a config.json, the ``sizes=`` of
:func:`~oxygen_ros.core.checkpoints.load_model`, and the flat ``KEY=VALUE`` text of the
command option ``--size`` and the node parameter ``model_sizes``.

The nested form (a config.json's object, or a mapping in Python)::

    {"vision": {"heads": 2, "hidden": 32}, "vlm": {"head_dim": 8}, "max_token_len": 48}

The flat form names the same fields with a dot, one ``KEY=VALUE`` item each,
as a comma list or a list of strings::

    "vision.heads=2,vlm.head_dim=8,max_token_len=48"
    ["vision.heads=2", "vlm.head_dim=8", "max_token_len=48"]

Every value is a positive integer. Precedence: sizes given to ``load_model``
(options, node parameter) win over the config.json's ``oxygen_sizes``, field
by field, which win over the layout's own config fields and the tensor shapes
(see :mod:`.sizes`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from ..model.config import GemmaConfig, ModelConfig, VisionConfig
from .errors import CheckpointError

#: config.json's object of explicit sizes (our field names; each one optional).
SIZE_BLOCK = "oxygen_sizes"
TOP_FIELDS = ("vocab_size", "max_token_len", "max_cameras", "action_dim", "action_horizon", "denoise_steps")
PART_FIELDS = {part: tuple(f.name for f in dataclasses.fields(cls))
               for part, cls in (("vision", VisionConfig), ("vlm", GemmaConfig), ("expert", GemmaConfig))}
#: every flat key, as ``--size`` and ``model_sizes`` write them
FLAT_KEYS = TOP_FIELDS + tuple(f"{part}.{name}" for part, names in PART_FIELDS.items() for name in names)
#: how each way of giving sizes is written, for the messages that say what to set
HOW_TO_SET = ("{block}.{key} in the checkpoint's config.json, --size {key}=N on a command, or "
              "model_sizes: [\"{key}=N\"] on the inference node (see docs/checkpoints.md)")


class SizesError(CheckpointError):
    """Explicit sizes that cannot be used (an unknown field, a bad value, sizes that do not fit together),
    or a size that neither they nor the tensor shapes give; the message names the field."""


def how_to_set(key: str) -> str:
    """The ways to give the size ``key`` (flat form, e.g. ``vision.heads``)."""
    return HOW_TO_SET.format(block=SIZE_BLOCK, key=key)


def check_sizes(block: Any, name: str = "sizes", where: str = "") -> dict[str, Any]:
    """The nested sizes ``block`` (a copy), every field name and value checked. Messages name
    ``name.field`` (``name``: e.g. ``oxygen_sizes``), after ``where:`` when given."""
    at = f"{where}: " if where else ""
    if not isinstance(block, Mapping):
        raise SizesError(f"{at}{name} must be an object (a mapping), got {type(block).__name__}")
    unknown = sorted(str(k) for k in set(block) - set(TOP_FIELDS) - set(PART_FIELDS))
    out: dict[str, Any] = {}
    for key, value in block.items():
        if key in PART_FIELDS:
            if not isinstance(value, Mapping):
                raise SizesError(f"{at}{name}.{key} must be an object, got {type(value).__name__}")
            unknown += sorted(f"{key}.{k}" for k in set(value) - set(PART_FIELDS[key]))
            out[key] = dict(value)
        elif key in TOP_FIELDS:
            out[key] = value
    if unknown:
        raise SizesError(f"{at}unknown field(s) in {name}: {', '.join(unknown)}; known: {', '.join(FLAT_KEYS)}")
    for key, value in _flat(out):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise SizesError(f"{at}{name}.{key} must be a positive integer, got {value!r}")
    return out


def merge_sizes(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``, field by field (both nested and checked)."""
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in base.items()}
    for key, value in over.items():
        if isinstance(value, Mapping):
            out[key] = {**out.get(key, {}), **value}
        else:
            out[key] = value
    return out


def parse_sizes(items: str | Iterable[str]) -> dict[str, Any]:
    """The nested sizes of flat ``KEY=VALUE`` items (a comma list, or strings that may each hold one);
    a :class:`SizesError` names the bad item. Empty items are skipped: ``""`` and ``[]`` give ``{}``."""
    if isinstance(items, str):
        items = [items]
    seen: dict[str, tuple[str, int]] = {}
    for text in items:
        if not isinstance(text, str):
            raise SizesError(f"size item {text!r} is not a string (write KEY=VALUE, e.g. vision.heads=2)")
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            key, value = parse_item(item)
            if key in seen and seen[key][1] != value:
                raise SizesError(f"size {key} given twice: {seen[key][0]!r} and {item!r}")
            seen[key] = (item, value)
    nested: dict[str, Any] = {}
    for key, (_, value) in seen.items():
        part, _, name = key.rpartition(".")
        (nested.setdefault(part, {}) if part else nested)[name] = value
    return nested


def parse_item(item: str) -> tuple[str, int]:
    """One ``KEY=VALUE`` item -> (flat key, value), or a :class:`SizesError` naming it."""
    key, eq, value = (s.strip() for s in item.partition("="))
    if not eq or not key:
        raise SizesError(f"size item {item!r}: expected KEY=VALUE, e.g. vision.heads=2")
    if key not in FLAT_KEYS:
        hint = f" (a group: name one of its fields, e.g. {key}.{PART_FIELDS[key][0]})" if key in PART_FIELDS else ""
        raise SizesError(f"size item {item!r}: unknown size {key!r}{hint}; known: {', '.join(FLAT_KEYS)}")
    try:
        number = int(value, 10)
    except ValueError:
        number = 0
    if number <= 0:
        raise SizesError(f"size item {item!r}: {key} must be a positive integer, got {value!r}")
    return key, number


def format_sizes(sizes: Mapping[str, Any]) -> str:
    """Nested sizes in the flat form (``vision.heads=2,max_token_len=48``), for logs and written files."""
    return ",".join(f"{k}={v}" for k, v in _flat(sizes))


def flat_items(sizes: Mapping[str, Any]) -> list[str]:
    """Nested sizes as a list of ``KEY=VALUE`` strings (the node parameter's form)."""
    return [f"{k}={v}" for k, v in _flat(sizes)]


def apply_sizes(config: ModelConfig, sizes: Mapping[str, Any], where: str) -> ModelConfig:
    """``config`` with the (checked) nested ``sizes`` replacing its fields (a native or preset config)."""
    if not sizes:
        return config
    try:
        parts = {part: dataclasses.replace(getattr(config, part), **sizes.get(part, {})) for part in PART_FIELDS}
        return config.replace(**parts, **{k: v for k, v in sizes.items() if k in TOP_FIELDS})
    except ValueError as exc:
        raise SizesError(f"{where} ({format_sizes(sizes)}) do not fit {config.name}'s other sizes: {exc}") from exc


def _flat(sizes: Mapping[str, Any]):
    for key, value in sizes.items():
        if isinstance(value, Mapping):
            yield from ((f"{key}.{k}", v) for k, v in value.items())
        else:
            yield key, value

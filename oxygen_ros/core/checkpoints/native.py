"""The project's own checkpoint format, and :func:`save_native`.

A native checkpoint is a directory::

    model.safetensors   every tensor of the model's state dict, under our key names
    config.json         {"format": "oxygen_ros.vla", "format_version": 1,
                         "dtype": "float32", "config": <ModelConfig as JSON>}
    tokenizer.model     (optional) the SentencePiece model the config's vocabulary belongs to
    norm_stats.json     (optional) state/action statistics, openpi's norm_stats.json form
    <extra files>       (optional) e.g. card.md, training.json

Tensors are stored in the dtype they have in the model, so a saved model's
weights load back bit-identically (in the loader's ``dtype``: float32 unless
asked otherwise, whatever ``config.json``'s ``dtype`` says).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
from collections.abc import Mapping
from typing import Any

import torch
from safetensors.torch import save_file

from ..model.config import GemmaConfig, ModelConfig, VisionConfig
from .errors import CheckpointError

FORMAT_NAME = "oxygen_ros.vla"
FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.model"
NORM_STATS_FILE = "norm_stats.json"
RESERVED_FILES = (WEIGHTS_FILE, CONFIG_FILE, TOKENIZER_FILE, NORM_STATS_FILE)


def config_to_dict(config: ModelConfig) -> dict[str, Any]:
    """The ModelConfig as plain JSON-able data (nested dicts for the parts). A native config.json
    states every size, so the sizes a foreign checkpoint left to pi0.5's defaults are not
    carried over as such (``extra["defaulted"]``)."""
    out = dataclasses.asdict(config)
    out["extra"] = {k: v for k, v in (out.get("extra") or {}).items() if k != "defaulted"}
    return out


def config_from_dict(data: Mapping[str, Any]) -> ModelConfig:
    """Inverse of :func:`config_to_dict`; unknown or missing fields are an error."""
    data = dict(data)
    try:
        vision = VisionConfig(**data.pop("vision"))
        vlm = GemmaConfig(**data.pop("vlm"))
        expert = GemmaConfig(**data.pop("expert"))
        return ModelConfig(vision=vision, vlm=vlm, expert=expert, **data)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"invalid model config: {exc}") from exc


def is_native_dir(path: pathlib.Path) -> bool:
    cfg = path / CONFIG_FILE
    if not cfg.is_file():
        return False
    try:
        return json.loads(cfg.read_text()).get("format") == FORMAT_NAME
    except (ValueError, AttributeError):
        return False


def read_native_config(path: pathlib.Path) -> tuple[ModelConfig, str]:
    """The config and the stored dtype name of a native checkpoint directory."""
    try:
        meta = json.loads((path / CONFIG_FILE).read_text())
    except ValueError as exc:
        raise CheckpointError(f"{path / CONFIG_FILE} is not valid JSON: {exc}") from exc
    if meta.get("format") != FORMAT_NAME:
        raise CheckpointError(f"{path / CONFIG_FILE} is not an {FORMAT_NAME} config (format={meta.get('format')!r})")
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: native format version {version!r} is not supported (this code reads version {FORMAT_VERSION})"
        )
    if not isinstance(meta.get("config"), dict):
        raise CheckpointError(f"{path / CONFIG_FILE} has no \"config\" object (the model's sizes, as save_native "
                              "writes them)")
    return config_from_dict(meta["config"]), str(meta.get("dtype", "float32"))


def save_native(
    model: torch.nn.Module,
    out_dir: str | os.PathLike[str],
    *,
    tokenizer_path: str | os.PathLike[str] | None = None,
    norm_stats: Any = None,
    extra: Mapping[str, str | bytes | Mapping] | None = None,
) -> pathlib.Path:
    """Write ``model`` as a native checkpoint directory (created if needed) and return its path.

    ``tokenizer_path``: a SentencePiece model copied in as ``tokenizer.model``.
    ``norm_stats``: a :class:`~oxygen_ros.core.normalization.Normalizer`, a
    dict in openpi's ``norm_stats.json`` form, or a path to any stats file
    :func:`~oxygen_ros.core.normalization.load_norm_stats` reads; written as
    ``norm_stats.json``. ``extra``: more files, ``{file name: content}`` with
    str/bytes written as is and a mapping written as JSON (e.g.
    ``{"card.md": "...", "training.json": {...}}``).
    """
    out = pathlib.Path(out_dir)
    config: ModelConfig = model.config
    extra = dict(extra or {})
    for name in extra:
        if name in RESERVED_FILES or pathlib.Path(name).name != name or name in ("", ".", ".."):
            raise ValueError(f"extra file name {name!r} must be a plain file name other than {RESERVED_FILES}")
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    dtype = str(model.dtype).removeprefix("torch.")
    save_file(state, str(out / WEIGHTS_FILE), metadata={"format": FORMAT_NAME, "format_version": str(FORMAT_VERSION)})
    _readable_as_umask_allows(out / WEIGHTS_FILE)
    meta = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "dtype": dtype, "config": config_to_dict(config)}
    (out / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    if tokenizer_path is not None:
        _copy_tokenizer(pathlib.Path(tokenizer_path), out)
    if norm_stats is not None:
        (out / NORM_STATS_FILE).write_text(json.dumps(_norm_stats_dict(norm_stats), indent=2) + "\n")
    for name, content in extra.items():
        _write_file(out / name, content)
    return out


def _readable_as_umask_allows(path: pathlib.Path) -> None:
    """Give ``path`` the mode of any file this process creates: safetensors writes its file
    readable by its owner only, which a robot's service running as another user cannot load."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def _copy_tokenizer(src: pathlib.Path, out: pathlib.Path) -> None:
    if not src.is_file():
        raise FileNotFoundError(f"tokenizer model not found: {src}")
    if src.resolve() != (out / TOKENIZER_FILE).resolve():
        shutil.copyfile(src, out / TOKENIZER_FILE)


def _norm_stats_dict(norm_stats: Any) -> Any:
    """Statistics in openpi's ``norm_stats.json`` form from a Normalizer, such a dict, or a stats file's path."""
    from ..normalization import Normalizer, load_norm_stats  # normalization imports nothing from here

    if isinstance(norm_stats, (str, os.PathLike)):
        norm_stats = load_norm_stats(norm_stats)
    if isinstance(norm_stats, Normalizer):
        norm_stats = norm_stats.to_openpi_dict()
    return norm_stats


def _write_file(target: pathlib.Path, content: str | bytes | Mapping) -> None:
    """str / bytes as is, a mapping as JSON."""
    if isinstance(content, bytes):
        target.write_bytes(content)
    elif isinstance(content, str):
        target.write_text(content)
    else:
        target.write_text(json.dumps(content, indent=2) + "\n")

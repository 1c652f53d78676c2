"""Reading tensors out of ``.safetensors`` files lazily (and refusing anything else).

Only safetensors is accepted: ``.bin``/``.pt``/``.pth``/``.pkl`` checkpoints
are Python pickles, and unpickling runs arbitrary code from the file.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
from safetensors import safe_open

from .errors import CheckpointError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}


def pickle_error(path: pathlib.Path) -> CheckpointError:
    return CheckpointError(
        f"{path}: only safetensors checkpoints are accepted (model.safetensors). "
        f"'{path.suffix}' files are Python pickles, and loading a pickle can run arbitrary code "
        "from the file, so they are never opened. Convert it once in a trusted environment, e.g. "
        "`safetensors.torch.save_file(torch.load(path, weights_only=True), 'model.safetensors')`."
    )


@dataclass(frozen=True)
class TensorInfo:
    file: pathlib.Path
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype name, e.g. "BF16"


def weight_files(directory: pathlib.Path) -> list[pathlib.Path]:
    """The safetensors files of a checkpoint directory (one file, or the shards of an index)."""
    index = directory / "model.safetensors.index.json"
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index}: not a safetensors index ({exc})") from exc
        files = [directory / n for n in names]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index} names shard files that do not exist", missing)
        return files
    loose = sorted(directory.glob("*.safetensors"))
    loose = [f for f in loose if f.name != "stats.safetensors" and "normalizer" not in f.name and "processor" not in f.name]
    if len(loose) == 1:
        return loose
    pickles = sorted(p for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise pickle_error(pickles[0])
    raise CheckpointError(
        f"{directory}: no model.safetensors (or model.safetensors.index.json) found; "
        f"files there: {sorted(p.name for p in directory.iterdir())}"
    )


def read_header(path: pathlib.Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Every tensor's name, shape and dtype, and the file metadata, from the header only."""
    try:
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 0 < size < 100_000_000:
                raise ValueError(f"implausible header size {size}")
            header = json.loads(f.read(size))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a safetensors file ({exc})") from exc
    meta = header.pop("__metadata__", None) or {}
    infos = {name: TensorInfo(path, tuple(h["shape"]), h["dtype"]) for name, h in header.items()}
    return infos, meta


def index_tensors(files: list[pathlib.Path]) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    tensors: dict[str, TensorInfo] = {}
    meta: dict[str, str] = {}
    for path in files:
        infos, m = read_header(path)
        dup = sorted(set(infos) & set(tensors))
        if dup:
            raise CheckpointError(f"tensor(s) stored in more than one shard of {path.parent}", dup)
        tensors.update(infos)
        meta.update(m)
    return tensors, meta


@contextmanager
def open_files(files: list[pathlib.Path]) -> Iterator[dict[pathlib.Path, object]]:
    """safe_open handles (memory-mapped, nothing read until a tensor is asked for)."""
    with ExitStack() as stack:
        yield {f: stack.enter_context(safe_open(str(f), framework="pt", device="cpu")) for f in files}

"""Reading tensors out of ``.safetensors`` files one at a time (and refusing anything else).

Only safetensors is accepted: ``.bin``/``.pt``/``.pth``/``.pkl`` checkpoints
are Python pickles, and unpickling runs arbitrary code from the file.

The format is an 8-byte little-endian header size, a JSON header (name ->
dtype, shape, byte offsets) and the raw little-endian data. Tensors are read
with plain ``readinto`` straight into the destination parameter's memory
(or into a one-tensor buffer when the dtype or device differs), not through
a memory map: mapped pages count as resident memory while the file is open,
which would make the peak about the model plus the whole file.
"""

from __future__ import annotations

import json
import pathlib
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch

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
        "`safetensors.torch.save_file({k: v.clone().contiguous() for k, v in torch.load(path, "
        "weights_only=True).items()}, 'model.safetensors')` (clone: the tied embed_tokens/lm_head pair is one "
        "tensor, which save_file refuses to write twice)."
    )


@dataclass(frozen=True)
class TensorInfo:
    file: pathlib.Path | None
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype name, e.g. "BF16"
    start: int = 0  # absolute byte offsets of the data in the file
    stop: int = 0


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
    hint = not_a_checkpoint_hint(directory, loose)
    raise CheckpointError(
        f"{directory}: no model.safetensors (or model.safetensors.index.json) found; "
        f"files there: {sorted(p.name for p in directory.iterdir())}" + (f". {hint}" if hint else "")
    )


def not_a_checkpoint_hint(directory: pathlib.Path, loose: list[pathlib.Path]) -> str:
    """What a directory without weights most likely is, and what to do: an openpi JAX
    checkpoint (``params/``), shards without their index, or a folder with checkpoints below
    it (a LeRobot ``checkpoints/last`` holds ``pretrained_model/``); empty when none fits."""
    if (directory / "params").is_dir():
        return ("It looks like an openpi JAX checkpoint (params/): convert it to PyTorch with openpi's "
                "examples/convert_jax_model_to_pytorch.py and point model_path at its output")
    if len(loose) > 1:
        return (f"{len(loose)} .safetensors files and no model.safetensors.index.json to say how they make one "
                "model: copy the shards' index next to them")
    below = sorted(str(f.parent.relative_to(directory)) for pattern in ("*/model.safetensors*", "*/*/model.safetensors*")
                   for f in directory.glob(pattern))
    below = list(dict.fromkeys(below))
    if below:
        return f"checkpoints below it: {', '.join(below[:5])}{' ...' if len(below) > 5 else ''}: point model_path at one"
    return ""


def read_header(path: pathlib.Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Every tensor's name, shape, dtype and byte range, and the file metadata, from the header only."""
    try:
        file_size = path.stat().st_size
        with open(path, "rb") as f:
            start = f.read(8)
            size = int.from_bytes(start, "little")
            if not 0 < size <= min(100_000_000, file_size - 8):
                raise ValueError(f"implausible header size {size}{_what_it_is(start + f.read(24))}")
            header = json.loads(f.read(size))
        meta = header.pop("__metadata__", None) or {}
        base = 8 + size
        infos = {}
        for name, h in header.items():
            begin, end = (base + int(o) for o in h["data_offsets"])
            shape = tuple(int(d) for d in h["shape"])
            item = torch.empty((), dtype=SAFETENSORS_DTYPES[h["dtype"]]).element_size() \
                if h["dtype"] in SAFETENSORS_DTYPES else None
            numel = 1
            for d in shape:
                numel *= d
            if not base <= begin <= end <= file_size or (item is not None and end - begin != numel * item):
                raise ValueError(f"tensor {name!r}: byte range {h['data_offsets']} does not fit shape {shape}, "
                                 f"dtype {h['dtype']} and the file size")
            infos[name] = TensorInfo(path, shape, h["dtype"], begin, end)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: not a valid safetensors file ({exc})") from exc
    return infos, meta


def _what_it_is(start: bytes) -> str:
    """What a file that is not safetensors looks like it is, from its first bytes ('' if unknown)."""
    if start.startswith(b"version https://git-lfs"):
        return ("; it is a Git LFS pointer, not the weights: fetch them (git lfs pull in the repository "
                "it was cloned from)")
    if start.lstrip().lower().startswith((b"<!doctype html", b"<html")):
        return "; it is an HTML page (a download that saved a web page instead of the file)"
    return ""


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
    """Unbuffered read handles, one per file."""
    with ExitStack() as stack:
        yield {f: stack.enter_context(open(f, "rb", buffering=0)) for f in files}


def read_into(handle, info: TensorInfo, dest: torch.Tensor) -> None:
    """Copy one stored tensor into ``dest`` (same shape), converting dtype/device as needed.

    When ``dest`` is a contiguous CPU tensor of the stored dtype, the bytes are
    read straight into it; otherwise into a buffer of this one tensor first.
    """
    src_dtype = SAFETENSORS_DTYPES[info.dtype]
    direct = (dest.device.type == "cpu" and dest.dtype == src_dtype and dest.is_contiguous()
              and sys.byteorder == "little")
    target = dest if direct else torch.empty(info.shape, dtype=src_dtype)
    raw = target.reshape(-1).view(torch.uint8).numpy()
    view = memoryview(raw)
    handle.seek(info.start)
    done, total = 0, info.stop - info.start
    while done < total:
        n = handle.readinto(view[done:total])
        if not n:
            raise CheckpointError(f"{info.file}: file ends inside a tensor (truncated checkpoint)")
        done += n
    if not direct:
        if sys.byteorder != "little":
            target = target.view(-1).byteswap().view(info.shape)  # pragma: no cover
        dest.copy_(target)

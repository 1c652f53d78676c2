"""Options every command shares: where the model comes from, device, precision, threads."""

from __future__ import annotations

import argparse
import sys

import torch

from ..core import checkpoints
from ..core.checkpoints import LoadedCheckpoint, SizesError, parse_sizes
from ..core.checkpoints.given_sizes import parse_item
from ..core.heap import keep_freed_memory
from ..core.model.config import PRESETS
from .arguments import positive_int


def add_model_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model")
    g.add_argument("--model-path", help="checkpoint directory (native, openpi-PyTorch or LeRobot pi05); "
                                        "default: the embedded default model")
    g.add_argument("--tokenizer-path", help="SentencePiece tokenizer.model (default: from the checkpoint)")
    g.add_argument("--norm-stats", help="norm_stats.json / LeRobot stats (default: from the checkpoint)")
    g.add_argument("--size", action="append", type=size_item, default=[], metavar="KEY=VALUE",
                   help="a model size, e.g. vision.heads=2 or max_token_len=48 (repeatable; a comma list works "
                        "too); wins over the checkpoint's config.json and its tensor shapes, or changes the "
                        "preset's (see docs/checkpoints.md)")
    g.add_argument("--preset", choices=sorted(PRESETS),
                   help="build a randomly initialised preset instead of loading weights")
    g.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default: cpu)")
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="precision of the model's weights and activations (bfloat16: half the bytes a "
                        "piece reads; default: float32)")
    g.add_argument("--threads", type=positive_int, default=1, help="torch intra-op threads (default: 1)")
    g.add_argument("--keep-freed-memory", choices=["on", "off"], default="on",
                   help="keep memory freed between frames in the process for reuse, so that large tensors do not "
                        "fault their pages in again each frame (glibc mallopt; default on, as the node's "
                        "keep_freed_memory parameter)")


def size_item(text: str) -> str:
    """One ``--size`` value (``KEY=VALUE``, or a comma list of them), checked; argparse names the bad one."""
    try:
        for item in filter(None, (part.strip() for part in text.split(","))):
            parse_item(item)
    except SizesError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def model_sizes(args: argparse.Namespace) -> dict:
    """The nested sizes of the ``--size`` options (a key given twice with two values is refused)."""
    try:
        return parse_sizes(getattr(args, "size", None) or [])
    except SizesError as exc:
        raise SystemExit(f"--size: {exc}") from None


def keeps_freed_memory(args: argparse.Namespace) -> bool:
    """Whether ``--keep-freed-memory`` is on (a namespace without it: on, the default)."""
    return getattr(args, "keep_freed_memory", "on") == "on"


def check_cameras(cameras: int | None, slots: int) -> None:
    """End the command naming ``--cameras`` when it asks for more than the model's camera ``slots``."""
    if cameras is not None and cameras > slots:
        raise SystemExit(f"--cameras {cameras} exceeds the model's {slots} camera slots")


def load_model(args: argparse.Namespace) -> LoadedCheckpoint:
    """The model, tokenizer and normaliser the options ask for (see
    :func:`oxygen_ros.core.checkpoints.load_model` for the precedence); a checkpoint
    that cannot be loaded ends the command with the loader's message."""
    if args.threads < 1:
        raise SystemExit(f"--threads must be >= 1, got {args.threads}")
    for option, value in (("--model-path", args.model_path), ("--tokenizer-path", args.tokenizer_path),
                          ("--norm-stats", args.norm_stats)):
        if value is not None and not value.strip():  # an unset shell variable: not the default model silently
            raise SystemExit(f"{option} is empty; leave it out for the default")
    if args.model_path and args.preset:
        raise SystemExit("give either --model-path or --preset, not both")
    if args.device.split(":")[0] not in ("cpu", "cuda"):
        raise SystemExit(f"--device must be cpu, cuda or cuda:N, got {args.device!r}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: this torch ({torch.__version__}) sees no CUDA device")
    sizes = model_sizes(args)
    torch.set_num_threads(args.threads)
    if keeps_freed_memory(args):
        print(keep_freed_memory(), file=sys.stderr)
    try:
        loaded = checkpoints.load_model(args.model_path, preset=args.preset, device=args.device, dtype=args.dtype,
                                        tokenizer_path=args.tokenizer_path, norm_stats_path=args.norm_stats,
                                        sizes=sizes)
    except checkpoints.CheckpointError as exc:
        raise SystemExit(f"cannot load the model: {exc}") from None
    defaulted = ", ".join(f"{size}={getattr(loaded.config, size)}" for size in loaded.config.extra.get("defaulted", ()))
    if defaulted:
        print(f"{loaded.source} does not state these sizes; pi0.5's defaults are used: {defaulted} (give "
              "--size KEY=VALUE where the checkpoint was trained with others)", file=sys.stderr)
    return loaded

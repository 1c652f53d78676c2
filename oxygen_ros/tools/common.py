"""Options every command shares: where the model comes from, device, precision, threads."""

from __future__ import annotations

import argparse

import torch

from ..core import checkpoints
from ..core.checkpoints import LoadedCheckpoint
from ..core.model.config import PRESETS


def add_model_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model")
    g.add_argument("--model-path", help="checkpoint directory (native, openpi-PyTorch or LeRobot pi05); "
                                        "default: the embedded default model")
    g.add_argument("--tokenizer-path", help="SentencePiece tokenizer.model (default: from the checkpoint)")
    g.add_argument("--norm-stats", help="norm_stats.json / LeRobot stats (default: from the checkpoint)")
    g.add_argument("--preset", choices=sorted(PRESETS),
                   help="build a randomly initialised preset instead of loading weights")
    g.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    g.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")


def load_model(args: argparse.Namespace) -> LoadedCheckpoint:
    """The model, tokenizer and normaliser the options ask for (see
    :func:`oxygen_ros.core.checkpoints.load_model` for the precedence)."""
    if args.threads < 1:
        raise SystemExit(f"--threads must be >= 1, got {args.threads}")
    if args.model_path and args.preset:
        raise SystemExit("give either --model-path or --preset, not both")
    torch.set_num_threads(args.threads)
    return checkpoints.load_model(args.model_path, preset=args.preset, device=args.device, dtype=args.dtype,
                                  tokenizer_path=args.tokenizer_path, norm_stats_path=args.norm_stats)

"""What ``oxygen-bench`` writes: the model's description, the JSON (``--json``) and the figures (``--plot``).

A write that fails (a full disk, a path refused only when written) does not end the command
in a traceback: the JSON then goes to stdout (:func:`~.arguments.write_output`), a failing
figure is said in one line and the JSON written before it is kept; the exit status is 1.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..core.checkpoints import LoadedCheckpoint
from .arguments import write_output
from .common import keeps_freed_memory

TOOL = "oxygen-bench"


def model_fields(loaded: LoadedCheckpoint) -> dict:
    """What a run was measured on: ``model`` where the weights came from (a checkpoint's folder,
    or ``preset tiny (random weights, ...)``), ``preset`` the random-weights preset's name (None
    for trained weights, whose sizes may match a preset's: the default model's are tiny's),
    ``config`` the model configuration's name."""
    return {"model": loaded.source, "preset": loaded.config.name if loaded.layout == "random" else None,
            "config": loaded.config.name}


def model_description(loaded: LoadedCheckpoint, args: argparse.Namespace) -> dict:
    """The JSON's ``model``: where it came from and how it ran."""
    fields = model_fields(loaded)
    return {"source": fields["model"], "preset": fields["preset"], "config": fields["config"],
            "device": args.device, "dtype": args.dtype, "threads": args.threads, "cameras": args.cameras,
            "keep_freed_memory": keeps_freed_memory(args)}


def write_json(result: dict, args: argparse.Namespace) -> bool:
    """``result`` into ``--json`` if given (said on stderr); False when the write failed (the JSON
    is then on stdout)."""
    if not args.json:
        return True
    if not write_output(args.json, json.dumps(result, indent=2, default=str) + "\n", TOOL):
        return False
    print(f"wrote {args.json}", file=sys.stderr)
    return True


def write_figures(result: dict, args: argparse.Namespace) -> bool:
    """The figures of ``result`` into ``--plot``: one mode and one number of agents (the first
    given). False, said in one line, when a figure cannot be written."""
    from .plots import write_plots

    first = [r for r in result["runs"] if r["compile"] == args.compile[0] and r["agents"] == args.agents[0]]
    try:
        paths = write_plots(dict(result, runs=first), args.plot)
    except OSError as exc:
        kept = f"; the JSON is in {args.json}" if args.json else ""
        print(f"{TOOL}: could not write the figures into {args.plot}: {exc.strerror or exc} "
              f"({exc.filename or args.plot}){kept}", file=sys.stderr)
        return False
    for path in paths:
        print(f"wrote {path}", file=sys.stderr)
    if "baseline" not in args.settings or len(args.settings) < 2:
        print("no speedup figures: they need baseline and another setting in --settings", file=sys.stderr)
    return True


def interrupted_note(runs: list[dict], frames: int) -> str:
    """The line said after a Ctrl-C: what the table and the JSON hold."""
    measured = sorted({r["frames_measured"] for r in runs})
    span = f"{measured[0]}-{measured[-1]}" if len(measured) > 1 else str(measured[0])
    return (f"{TOOL}: interrupted: the table and --json hold the {span} of {frames} frames measured so far "
            f"in each of {len(runs)} runs (frames_measured; \"interrupted\": true)")

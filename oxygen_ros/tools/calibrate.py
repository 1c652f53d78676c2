"""oxygen-calibrate: pick the per-frame decode budget k offline, as the OxyGen paper does.

It measures, on this device and model, the prefill of one observation, one
denoise step, and one batched decode step against batch size; then picks the
largest k whose frame (prefill + S denoise steps + k decode steps at the
steady-state active batch) keeps the action frequency f = H / T at or above
``--target-hz`` and fits the inference node's own frame deadline (at the
robot's ``--control-rate-hz``, half the time a chunk covers, as the node's
language budget counts it: a larger k would be cut back every frame), with a
safety margin. The choice is written as a ROS 2
parameters file for the inference node (``params_file:=...``).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import pathlib
import sys

import yaml

from ..core.benchmark import measure_components
from ..core.budget import frame_deadline_ms
from ..core.model.compile_setup import COMPILE_CHOICES, CannotBuild, resolve_compile, use_compile_cache
from ..core.model.warm_up_progress import bucket_lines, packages_built_first
from ..core.checkpoints.given_sizes import flat_items
from .arguments import DefaultsHelp, output_file, plain, positive_float, positive_int, write_output
from .common import add_model_args, check_cameras, load_model, model_sizes


#: said (and written) when the model measured is a random-weights preset
PRESET_NOTE = ("measured the preset {preset} with random weights, which the inference node does not run (it "
               "runs model_path, or the shipped default model): the k written is for a checkpoint of the preset's "
               "shapes; set model_path to one (the preset's model_sizes are left out of the file)")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="oxygen-calibrate", description=plain(__doc__.split("\n")[0]),
                                formatter_class=DefaultsHelp)
    p.add_argument("--target-hz", type=positive_float, required=True,
                   help="required action frequency f = H / T (H actions per chunk, T a frame's time): chunks must "
                        "come at least as fast as the robot uses them, so f must be at least --control-rate-hz; "
                        "the node's own frame deadline (see --control-rate-hz) is a separate limit, and k meets both")
    p.add_argument("--max-decode", type=positive_int, default=30, help="N: tokens per language request")
    p.add_argument("--denoise-steps", type=positive_int, default=None, help="S (default: the checkpoint's)")
    p.add_argument("--arrivals-per-frame", type=positive_float, default=1.0,
                   help="expected new language requests per frame (sets the steady-state batch)")
    p.add_argument("--cameras", type=positive_int, default=None,
                   help="your robot's cameras per observation, written as max_cameras (default: the model's "
                        "camera slots)")
    p.add_argument("--control-rate-hz", type=positive_float, default=50.0,
                   help="the robot's control rate (the node's control_rate_hz): the node's frame deadline is half "
                        "the time a chunk covers at it")
    p.add_argument("--frame-deadline-ms", type=positive_float, default=None,
                   help="the node's frame_deadline_ms, when set in its parameters (default: automatic, as the node)")
    p.add_argument("--margin", type=float, default=0.9,
                   help="use at most this fraction of the deadline (in (0, 1]; the rest is headroom for a slower "
                        "frame)")
    p.add_argument("--repeats", type=positive_int, default=30, help="timed repetitions per measurement (median)")
    p.add_argument("--out", type=output_file, required=True, help="parameters YAML to write")
    p.add_argument("--compile", default="auto", choices=COMPILE_CHOICES,
                   help="measure the compiled pieces (auto: on CUDA, eager on CPU)")
    add_model_args(p)
    args = p.parse_args(argv)
    if not 0 < args.margin <= 1:
        p.error("--margin must be in (0, 1]")
    return args


def steady_batch(n: int, k: int, arrivals: float) -> int:
    """Active requests in steady state: each lives 1 + ceil((N-1)/k) frames."""
    return max(1, math.ceil(arrivals * (1 + math.ceil((n - 1) / k))))


def deadline_ms(horizon: int, target_hz: float, frame_deadline_ms: float | None = None) -> float:
    """The frame time k must keep within (before the margin): H / target_hz, and the node's
    frame deadline when given (:func:`~oxygen_ros.core.budget.frame_deadline_ms`), whichever
    is shorter."""
    paper = horizon / target_hz * 1e3
    return paper if frame_deadline_ms is None else min(paper, frame_deadline_ms)


def choose_k(components: dict, *, n: int, s: int, horizon: int, target_hz: float, margin: float,
             arrivals: float, frame_deadline_ms: float | None = None) -> tuple[int, list[dict]]:
    """The largest k in 1..N meeting the deadline (:func:`deadline_ms`; 0 if even k=1 does not)."""
    limit_ms = deadline_ms(horizon, target_hz, frame_deadline_ms) * margin
    decode = components["decode_step_ms"]
    sizes = sorted(decode)
    table, best = [], 0
    for k in range(1, n + 1):
        b = steady_batch(n, k, arrivals)
        # decode cost at batch b: measured, or linearly extrapolated from the two largest sizes
        if b in decode:
            step = decode[b]
        elif b < sizes[-1]:
            above = min(x for x in sizes if x >= b)
            step = decode[above]
        else:
            lo, hi = sizes[-2] if len(sizes) > 1 else sizes[-1], sizes[-1]
            slope = (decode[hi] - decode[lo]) / (hi - lo) if hi != lo else 0.0
            step = decode[hi] + slope * (b - hi)
        frame = components["prefill_ms"] + s * components["denoise_step_ms"] + k * step
        ok = frame <= limit_ms
        table.append({"k": k, "batch": b, "frame_ms": round(frame, 3), "ok": ok})
        if ok:
            best = k
    return best, table


def node_parameters(args: argparse.Namespace, k: int, preset_only: bool, cameras: int) -> dict:
    """The inference node's parameters the choice of ``k`` was made under: the node runs it
    under the same conditions (rate, deadline, threads, the cameras measured, the model and its files)."""
    absolute = {  # absolute: the file is copied into a robot's agent.yaml and run from anywhere
        name: str(pathlib.Path(value).resolve()) for name, value in (
            ("model_path", args.model_path), ("tokenizer_path", args.tokenizer_path),
            ("norm_stats_path", args.norm_stats)) if value}
    return {
        "setting": "oxygen", "steps_per_frame": k, "max_decode": args.max_decode,
        "denoise_steps": args.denoise_steps or 0, "control_rate_hz": args.control_rate_hz,
        **({"frame_deadline_ms": args.frame_deadline_ms} if args.frame_deadline_ms else {}),
        "threads": args.threads, "device": args.device, "dtype": args.dtype, "compile": args.compile,
        "max_cameras": cameras, **absolute,
        # the model measured; a preset's sizes would be put on the model the node runs instead
        **({"model_sizes": flat_items(model_sizes(args))} if args.size and not preset_only else {}),
    }


def frame_budget_text(deadline: float, margin: float, why: str) -> str:
    """The time a frame may use, as the choice compares it: ``margin`` of the ``deadline`` (ms),
    with ``why`` the deadline is what it is."""
    return f"{deadline * margin:.2f} ms a frame may use (--margin {margin:g} of the deadline {deadline:.1f} ms: {why})"


def margin_text(actions_ms: float, deadline: float, margin: float) -> str:
    """What a larger ``--margin`` would do for actions of ``actions_ms`` that miss ``margin`` of
    the ``deadline``: let them in (which margin), or nothing (they miss the whole deadline)."""
    if actions_ms > deadline:
        return ""
    needed = math.ceil(actions_ms / deadline * 100) / 100
    return f", or a --margin of {needed:g} (at most 1; less headroom for a slower frame)"


def _say_choice(k: int, table: list[dict], actions_ms: float, s: int, budget: str, fits: bool, remedy: str) -> bool:
    """Print the k chosen, or why none; False when even the actions alone (``actions_ms``: prefill
    and ``s`` denoise steps) do not fit (``fits``) the time a frame may use (``budget``,
    :func:`frame_budget_text`): the target cannot be met (the file still gets k=0, the closest).
    ``remedy``: what lifts the limits missed (:func:`remedy_text`, :func:`margin_text`)."""
    if not fits:
        print(f"the target cannot be met: the actions alone (prefill and {s} denoise steps, {actions_ms:.2f} ms) "
              f"take longer than the {budget}; writing k=0 (exit status 1): {remedy}, or use fewer "
              "cameras, fewer denoise steps or a faster device", file=sys.stderr)
        return False
    if k == 0:
        print(f"no k meets the {budget}; writing k=0: language decoding only when there is headroom",
              file=sys.stderr)
    else:
        print(f"chosen k = {k} (frame {table[k - 1]['frame_ms']:.2f} ms at batch {table[k - 1]['batch']}; "
              f"within the {budget})")
    return True


def remedy_text(needed_ms: float, target_ms: float, node_ms: float, args, horizon: int) -> str:
    """What lifts the limits that ``needed_ms`` (the actions over the margin) misses: the
    target's (``target_ms``), the node's frame deadline (``node_ms``), or both."""
    chunk_ms = horizon / args.control_rate_hz * 1e3
    node_fix = (f"give a larger --frame-deadline-ms (its frame_deadline_ms; at most the chunk's {chunk_ms:.1f} "
                "ms, with less headroom against underruns)")
    if not args.frame_deadline_ms:  # the deadline is half a chunk: a slower control rate lengthens it
        node_fix = f"lower --control-rate-hz (a chunk of {horizon} actions lasts longer), or {node_fix}"
    misses_target, misses_node = needed_ms > target_ms, needed_ms > node_ms
    if misses_target and misses_node:
        return f"lower --target-hz, and (the node's frame deadline is missed too) {node_fix}"
    if misses_node:
        return f"the node's frame deadline is the limit, not the target: {node_fix}"
    return "lower --target-hz"


def _report_choice(args: argparse.Namespace, comp: dict, k: int, table: list[dict], s: int, horizon: int,
                   node_ms: float) -> bool:
    """Say the k chosen (:func:`_say_choice`) against the time a frame may use, and why it is that
    long; False when even the actions alone do not fit it."""
    paper_ms = deadline_ms(horizon, args.target_hz)
    limit_ms = deadline_ms(horizon, args.target_hz, node_ms)
    why = (f"f >= {args.target_hz:g} Hz needs {paper_ms:.1f} ms for H={horizon}; the node's frame deadline is "
           f"{node_ms:.1f} ms" + ("" if args.frame_deadline_ms else
                                  f", half a chunk at --control-rate-hz {args.control_rate_hz:g}"))
    actions_ms = comp["prefill_ms"] + s * comp["denoise_step_ms"]
    remedy = (remedy_text(actions_ms / args.margin, paper_ms, node_ms, args, horizon)
              + margin_text(actions_ms, limit_ms, args.margin))
    return _say_choice(k, table, actions_ms, s, frame_budget_text(limit_ms, args.margin, why),
                       actions_ms <= limit_ms * args.margin, remedy)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def timed_pieces(model, tokenizer, *, compile: bool, **options) -> dict:
    """The pieces' medians (:func:`~oxygen_ros.core.benchmark.measure_components`, ``options`` as
    its), compiled saying a line per bucket as its package is built or loaded."""
    return measure_components(model, tokenizer, compile=compile, progress=bucket_lines(_say) if compile else None,
                              note=_say, **options)


def _measure(args: argparse.Namespace, measure) -> dict:
    """``measure(compile=...)`` compiled where ``--compile`` says and it can be, else eager (saying why)."""
    decision = resolve_compile(args.compile, args.device)
    if args.compile == "on" and not decision.enabled:
        print(f"compile=on runs eager: {decision.reason}", file=sys.stderr)
    if decision.enabled:  # nothing else is said while they build (a walkthrough waited 2 minutes without a word)
        _say(packages_built_first(use_compile_cache()))
    try:
        comp = measure(compile=decision.enabled)
    except CannotBuild as e:  # no compiler, or a read-only cache, and packages missing from it
        print(f"compile={args.compile} runs eager: {e}", file=sys.stderr)
        return measure(compile=False)
    if decision.enabled:
        print("measured compiled, on packages of the pieces' own shapes: an agent with compile:=on still builds "
              "its own (other shapes: its pool, its buckets) at its first start", file=sys.stderr)
    return comp


def main(argv=None) -> int:
    args = parse_args(argv)
    loaded = load_model(args)
    c = loaded.model.config
    check_cameras(args.cameras, c.max_cameras)
    cameras = args.cameras or c.max_cameras
    if args.cameras is None:
        print(f"--cameras not given: measuring with the model's {cameras} camera slots (max_cameras {cameras}); "
              "give your robot's count for the k it can afford", file=sys.stderr)
    sizes = sorted({1, 2, 4, 8, 16, steady_batch(args.max_decode, 1, args.arrivals_per_frame)})
    print(f"measuring {loaded.source} on {args.device} ({args.dtype}) ...", file=sys.stderr)
    s = args.denoise_steps or c.denoise_steps
    comp = _measure(args, functools.partial(timed_pieces, loaded.model, loaded.tokenizer, batch_sizes=sizes,
                                            cameras=cameras, repeats=args.repeats, denoise_steps=s))
    node_ms = frame_deadline_ms(c.action_horizon, args.control_rate_hz, args.frame_deadline_ms)  # as the node
    k, table = choose_k(comp, n=args.max_decode, s=s, horizon=c.action_horizon, target_hz=args.target_hz,
                        margin=args.margin, arrivals=args.arrivals_per_frame, frame_deadline_ms=node_ms)
    print(f"prefill {comp['prefill_ms']:.2f} ms, denoise step {comp['denoise_step_ms']:.2f} ms, decode step "
          + ", ".join(f"B={b}: {t:.2f} ms" for b, t in comp["decode_step_ms"].items()))
    reachable = _report_choice(args, comp, k, table, s, c.action_horizon, node_ms)
    preset_only = bool(args.preset) and not args.model_path
    if preset_only:
        print("note: " + PRESET_NOTE.format(preset=args.preset), file=sys.stderr)
    params = {"oxygen_inference": {"ros__parameters": node_parameters(args, k, preset_only, cameras)}}
    note = f"# {PRESET_NOTE.format(preset=args.preset)}\n" if preset_only else ""
    header = (f"# written by oxygen-calibrate for {loaded.source} on {args.device} ({args.dtype})\n{note}"
              f"# target {args.target_hz} Hz, control_rate_hz {args.control_rate_hz:g}, frame deadline "
              f"{node_ms:.1f} ms, H={c.action_horizon}, S={s}, N={args.max_decode}, {cameras} camera(s)\n"
              f"# measured: {json.dumps({k2: v for k2, v in comp.items()}, default=str)}\n")
    if not write_output(args.out, header + yaml.safe_dump(params, sort_keys=False), "oxygen-calibrate"):
        return 1  # it said why, and printed the file on stdout
    print(f"wrote {args.out}: try it on the demo with `oxygen-agent demo:=true params_file:={args.out}`; it holds the "
          "inference node's section only, and a params_file takes the place of config/agent.yaml, so on a robot put "
          "its values in your copy of config/agent.yaml (its cameras and topics come from there)", file=sys.stderr)
    return 0 if reachable else 1


if __name__ == "__main__":
    sys.exit(main())

"""oxygen-bench: the OxyGen paper's experiments on any preset and device.

Example (the sweep in the README)::

    oxygen-bench --settings baseline,parallel,shared_kv,oxygen --max-decode 10,20,30 \\
        --steps-per-frame 1,2,5 --frames 60 --json bench.json --plot figures/
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import sys

from tqdm import tqdm

from ..core.benchmark import RunSpec, measure_components, run_setting, synthetic_observations, upper_bound
from ..core.engine import SETTINGS
from ..core.workloads import Workload
from .common import add_model_args, load_model


def int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def setting_list(text: str) -> list[str]:
    values = [x for x in text.split(",") if x]
    bad = [x for x in values if x not in SETTINGS]
    if bad or not values:
        raise argparse.ArgumentTypeError(f"unknown setting(s) {bad}; choose from {', '.join(SETTINGS)}")
    return values


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="oxygen-bench", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--settings", type=setting_list, default=list(SETTINGS), help="comma-separated settings")
    p.add_argument("--denoise-steps", type=int_list, default=None,
                   help="S (comma list to sweep; default: the checkpoint's)")
    p.add_argument("--max-decode", type=int_list, default=[30], help="N: tokens per request (comma list)")
    p.add_argument("--steps-per-frame", type=int_list, default=[5], help="k: decode steps per frame (comma list)")
    p.add_argument("--frames", type=int, default=60, help="measured frames per run")
    p.add_argument("--warmup", type=int, default=10, help="frames run before measuring")
    p.add_argument("--arrivals", default="uniform:1", help="uniform:R | poisson:L | random-length:A-B")
    p.add_argument("--agents", type=int, default=1, help="observations per frame (several robots)")
    p.add_argument("--cameras", type=int, default=1, help="cameras per observation")
    p.add_argument("--max-active", type=int, default=16, help="language requests decoding at once")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=pathlib.Path, help="write the results here")
    p.add_argument("--plot", type=pathlib.Path, help="write PNG figures into this directory")
    add_model_args(p)
    args = p.parse_args(argv)
    try:
        Workload.parse(args.arrivals)
    except ValueError as e:
        p.error(str(e))
    for name in ("frames", "agents", "cameras", "max_active"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    loaded = load_model(args)
    model, tok = loaded.model, loaded.tokenizer
    c = model.config
    print(f"model: {loaded.source} ({c.name}), device {args.device}, dtype {args.dtype}, threads {args.threads}",
          file=sys.stderr)
    obs = synthetic_observations(32, c.vision.image_size, args.cameras, seed=args.seed)
    denoise = args.denoise_steps or [c.denoise_steps]
    combos = [(s, n, k, S) for S, n, k, s in itertools.product(denoise, args.max_decode, args.steps_per_frame,
                                                                args.settings) if k <= n]
    if not combos:
        raise SystemExit("no run: every --steps-per-frame exceeds every --max-decode")
    runs = []
    total = sum(args.frames + args.warmup for _ in combos)
    # the bar shows on a terminal only (disable=None), and only for long sweeps
    with tqdm(total=total, unit="frame", disable=True if total < 200 else None, file=sys.stderr) as bar:
        for setting, n, k, S in combos:
            spec = RunSpec(setting, n, k, S, args.frames, args.warmup, args.arrivals, agents=args.agents,
                           max_active=args.max_active, seed=args.seed)
            bar.set_description(f"{setting} N={n} k={k} S={S}")
            r = run_setting(model, tok, spec, obs, on_frame=lambda: bar.update(1))
            r["preset"] = c.name
            runs.append(r)
    components = measure_components(model, tok, cameras=args.cameras)
    bounds = {}
    for S, n, k in sorted({(r["S"], r["N"], r["k"]) for r in runs}):
        ox = [r for r in runs if r["setting"] == "oxygen" and (r["S"], r["N"], r["k"]) == (S, n, k)]
        per_frame = ox[0]["language_throughput_tps"] * ox[0]["frame_latency_ms"]["mean"] / 1e3 if ox else None
        bounds[bound_key(S, n, k)] = upper_bound(components, S=S, k=k, H=c.action_horizon,
                                                 tokens_per_frame=per_frame)
    result = {"runs": runs, "upper_bound": bounds, "components": components,
              "model": {"source": loaded.source, "preset": c.name, "device": args.device, "dtype": args.dtype,
                        "threads": args.threads}}
    print_table(runs, bounds)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=str))
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plot:
        from .plots import write_plots

        for path in write_plots(result, args.plot):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def bound_key(S: int, n: int, k: int) -> str:
    return f"S={S},N={n},k={k}"


def print_table(runs: list[dict], bounds: dict) -> None:
    base = {(r["N"], r["k"], r["S"]): r for r in runs if r["setting"] == "baseline"}
    head = f"{'setting':<10} {'N':>3} {'k':>3} {'S':>3} {'T mean':>8} {'T p99':>8} {'f (Hz)':>8} " \
           f"{'tau (tok/s)':>11} {'B':>5} {'copy B/fr':>9} {'speedup':>7} {'ideal':>6}"
    print(head)
    print("-" * len(head))
    for r in runs:
        b = base.get((r["N"], r["k"], r["S"]))
        ub = bounds.get(bound_key(r["S"], r["N"], r["k"]))
        speed = f"{r['action_frequency_hz'] / b['action_frequency_hz']:.2f}" if b else "-"
        ideal = f"{b['frame_latency_ms']['mean'] / ub['frame_latency_ms']:.2f}" if b and ub else "-"
        print(f"{r['setting']:<10} {r['N']:>3} {r['k']:>3} {r['S']:>3} {r['frame_latency_ms']['mean']:>8.2f} "
              f"{r['frame_latency_p99_ms']:>8.2f} {r['action_frequency_hz']:>8.1f} "
              f"{r['language_throughput_tps']:>11.1f} {r['avg_batch_size']:>5.2f} "
              f"{r['kv_copy_bytes_per_frame']:>9.0f} {speed:>7} {ideal:>6}")
    for key, ub in bounds.items():
        print(f"upper bound {key}: T {ub['frame_latency_ms']:.2f} ms, f {ub['action_frequency_hz']:.1f} Hz, "
              f"tau {ub['language_throughput_tps']:.1f} tok/s")


if __name__ == "__main__":
    sys.exit(main())

"""oxygen-bench: the OxyGen paper's experiments on any preset and device.

Example (the sweep in the README)::

    oxygen-bench --settings baseline,parallel,shared_kv,oxygen --max-decode 10,20,30 \\
        --steps-per-frame 1,2,5 --frames 60 --json bench.json --plot figures/

Several robots served by one frame (the 1-agent frame is what the others are compared with)::

    oxygen-bench --settings oxygen --agents 1,2,4 --threads 1

All the runs of one command run side by side, a frame of each in turn, and the pieces
behind the upper bound are timed alone between their rounds of frames, so that every
ratio is measured under the same load (every run's engine is built first: a large
sweep holds them all at once).

Compiled against eager, side by side in one run (the compile time is reported, not measured)::

    oxygen-bench --settings baseline,oxygen --compile on,off --threads 1

The pieces alone (no frames), eager and compiled, the prefill against its own matrix products::

    oxygen-bench --pieces-only --preset pi05 --dtype bfloat16 --cameras 3 --threads 2 --compile on,off

How late a control tick in the same process runs beside the frames (no ROS), eager and compiled::

    oxygen-bench --tick-probe 20 --settings oxygen --compile on,off --threads 1
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import textwrap

from tqdm import tqdm

from ..core.benchmark import (RunSpec, compare_agents, denoise_sweep, piece_timer, run_interleaved,
                               synthetic_observations, upper_bound, with_prompt_tokens)
from ..core.engine import SETTINGS
from ..core.model.compile_setup import COMPILE_CHOICES, CannotBuild, resolve_compile, use_compile_cache
from ..core.model.load_probe import LibraryLoadError
from ..core.piece_timing import PieceTimer
from ..core.workloads import Workload
from .arguments import DefaultsHelp, non_negative_int, output_dir, output_file, plain, positive_float, positive_int
from .common import add_model_args, check_cameras, keeps_freed_memory, load_model


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


def compile_list(text: str) -> list[str]:
    values = [x for x in text.split(",") if x]
    if not values or any(x not in COMPILE_CHOICES for x in values):
        raise argparse.ArgumentTypeError(f"expected a comma list of {', '.join(COMPILE_CHOICES)}, got {text!r}")
    return list(dict.fromkeys(values))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="oxygen-bench", description=plain(__doc__.split("\n")[0]),
                                formatter_class=DefaultsHelp)
    p.add_argument("--settings", type=setting_list, default=list(SETTINGS), help="comma-separated settings")
    p.add_argument("--denoise-steps", type=int_list, default=None,
                   help="S (comma list to sweep; default: the checkpoint's)")
    p.add_argument("--max-decode", type=int_list, default=[30], help="N: tokens per request (comma list)")
    p.add_argument("--steps-per-frame", type=int_list, default=[5], help="k: decode steps per frame (comma list)")
    p.add_argument("--frames", type=positive_int, default=60, help="measured frames per run")
    p.add_argument("--warmup", type=non_negative_int, default=10, help="frames run before measuring")
    p.add_argument("--arrivals", default="uniform:1", help="uniform:R | poisson:L | random-length:A-B")
    p.add_argument("--agents", type=int_list, default=[1],
                   help="observations per frame, one per robot (comma list to sweep)")
    p.add_argument("--cameras", type=positive_int, default=1, help="cameras per observation")
    p.add_argument("--max-active", type=positive_int, default=16, help="language requests decoding at once")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", type=compile_list, default=["auto"],
                   help="compile the model's pieces: on, off, auto (CUDA: on, CPU: off); on,off runs both")
    p.add_argument("--action-horizon", type=positive_int, help="H: actions per chunk (default: the model's)")
    p.add_argument("--prompt-tokens", type=positive_int, help="pad or cut each instruction to exactly this many "
                                                     "prompt tokens (default: as the scenes say it)")
    p.add_argument("--json", type=output_file, help="write the results here")
    p.add_argument("--plot", type=output_dir, help="write PNG figures into this directory")
    p.add_argument("--pieces-only", action="store_true",
                   help="no frames: time the pieces alone under each --compile mode, and the prefill against "
                        "its own matrix products as plain ones (oxygen_ros/tools/bench_pieces.py)")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed calls of each piece with --pieces-only")
    p.add_argument("--tick-probe", type=positive_float, metavar="SECONDS",
                   help="no table of runs: frames of the first --settings back to back for SECONDS per compile "
                        "mode, with and without the tick guard, beside a thread ticking in the same process; "
                        "the ticks' lateness (oxygen_ros/tools/bench_ticks.py)")
    p.add_argument("--tick-period-ms", type=positive_float, default=2.0,
                   help="the probe's tick period with --tick-probe")
    add_model_args(p)
    args = p.parse_args(argv)
    try:
        workload = Workload.parse(args.arrivals)
        for n in args.max_decode:
            workload.check(n)
    except ValueError as e:
        p.error(f"--arrivals: {e}")
    if args.json and args.plot and args.json.resolve() == args.plot.resolve():
        p.error(f"--json and --plot name the same path ({args.json}): the figures go into a folder")
    if args.pieces_only and args.tick_probe:
        p.error("--pieces-only and --tick-probe are two different runs: give one of them")
    if (args.pieces_only or args.tick_probe) and args.plot:
        p.error("--plot draws the frames of runs: --pieces-only and --tick-probe run none")
    return args


def run_combinations(args, denoise: list) -> list[tuple]:
    """Every (setting, N, k, S, compile, agents) run of the options, but those with k > N (said)."""
    combos = [(s, n, k, S, m, a) for m, S, n, k, s, a in itertools.product(
        args.compile, denoise, args.max_decode, args.steps_per_frame, args.settings, args.agents) if k <= n]
    if not combos:
        raise SystemExit("no run: every --steps-per-frame exceeds every --max-decode")
    skipped = sorted({(k, n) for n in args.max_decode for k in args.steps_per_frame if k > n})
    if skipped:
        print("not run (k > N): " + ", ".join(f"k={k} with N={n}" for k, n in skipped), file=sys.stderr)
    return combos


def main(argv=None) -> int:
    args = parse_args(argv)
    loaded = load_model(args)
    model, tok = loaded.model, loaded.tokenizer
    if args.action_horizon:  # the action expert takes any horizon: its suffix is H tokens
        model.config = dataclasses.replace(model.config, action_horizon=args.action_horizon)
    c = model.config
    check_cameras(args.cameras, c.max_cameras)
    if args.prompt_tokens and args.prompt_tokens > c.max_token_len:
        raise SystemExit(f"--prompt-tokens {args.prompt_tokens} exceeds the model's max_token_len {c.max_token_len}")
    print(f"model: {loaded.source} ({c.name}), H={c.action_horizon} actions per chunk, device {args.device}, "
          f"dtype {args.dtype}, threads {args.threads}", file=sys.stderr)
    if any(resolve_compile(m, args.device).enabled for m in args.compile):
        # nothing else is printed while they build (a walkthrough waited 5 minutes without a word)
        print(f"compiled runs: their packages not in the cache ({use_compile_cache()}) are built first, "
              "a few minutes when it is empty", file=sys.stderr)
    if args.pieces_only:
        return pieces_only(model, tok, args, loaded.source)
    if args.tick_probe:
        return tick_probe(model, tok, args, loaded.source)
    obs = synthetic_observations(32, c.vision.image_size, args.cameras, seed=args.seed)
    if args.prompt_tokens:
        try:
            obs = [with_prompt_tokens(o, tok, args.prompt_tokens) for o in obs]
        except ValueError as e:
            raise SystemExit(str(e)) from None
    combos = run_combinations(args, denoise_sweep(args.denoise_steps, c))
    runs, components, components_compile_s = run_all(model, tok, args, obs, combos)
    compare_agents(runs)
    bounds = upper_bounds(model, runs, components)
    result = {"runs": runs, "upper_bound": bounds, "components": components.get(False),
              "components_compiled": components.get(True),
              # the compiled piece timer's own packages (other shapes than the runs'): part of a cold start's wait
              "components_compile_s": components_compile_s,
              "model": {"source": loaded.source, "preset": c.name, "device": args.device, "dtype": args.dtype,
                        "threads": args.threads, "keep_freed_memory": keeps_freed_memory(args)}}
    print_table(runs, bounds)
    print_components(components)
    if components_compile_s is not None:
        print(f"  (the compiled pieces' own packages: loaded or built in {components_compile_s:.1f} s)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=str))
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plot:
        plot(result, args)
    return 0


def plot(result: dict, args: argparse.Namespace) -> None:
    """The figures of ``result`` into ``--plot``: one mode and one number of agents (the first given)."""
    from .plots import write_plots

    first = [r for r in result["runs"] if r["compile"] == args.compile[0] and r["agents"] == args.agents[0]]
    for path in write_plots(dict(result, runs=first), args.plot):
        print(f"wrote {path}", file=sys.stderr)
    if "baseline" not in args.settings or len(args.settings) < 2:
        print("no speedup figures: they need baseline and another setting in --settings", file=sys.stderr)


def pieces_only(model, tok, args: argparse.Namespace, source: str) -> int:
    from .bench_pieces import print_pieces, run_pieces

    result = run_pieces(model, tok, args)
    print_pieces(result)
    return _write(result, model, args, source)


def tick_probe(model, tok, args: argparse.Namespace, source: str) -> int:
    from .bench_ticks import print_tick_probe, run_tick_probe

    result = run_tick_probe(model, tok, args)
    print_tick_probe(result)
    return _write(result, model, args, source)


def _write(result: dict, model, args: argparse.Namespace, source: str) -> int:
    """``result`` with the model's description, into ``--json`` if given."""
    result["model"] = {"source": source, "preset": model.config.name, "device": args.device, "dtype": args.dtype,
                       "threads": args.threads, "cameras": args.cameras,
                       "keep_freed_memory": keeps_freed_memory(args)}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=str))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def run_all(model, tok, args: argparse.Namespace, obs: list, combos: list[tuple]) -> tuple[list[dict], dict,
                                                                                        float | None]:
    """Every run of the sweep, in the order of ``combos``, side by side (``run_interleaved``: a frame
    of each in turn), and the pieces timed alone between their rounds of frames (:func:`piece_timers`):
    the runs' ratios (speedups, and against the upper bound) are measured under the same load, on a
    machine whose speed drifts. Returns the runs, the pieces' medians {compiled: components} and the
    seconds the compiled pieces' timer took to set up (loading or building packages of its own shapes;
    None: no compiled timer)."""
    specs = [RunSpec(setting, n, k, S, args.frames, args.warmup, args.arrivals, agents=a,
                     max_active=args.max_active, seed=args.seed, compile=mode, cameras=args.cameras,
                     keep_freed_memory=keeps_freed_memory(args))
             for setting, n, k, S, mode, a in combos]
    rounds = args.frames + args.warmup
    stride = max(1, rounds // PIECE_SAMPLES)  # the samples spread over the whole run
    timers: dict[bool, PieceTimer] = {}

    def after_round(runs: list, f: int) -> None:
        if not timers:
            timers.update(piece_timers(model, tok, args, max(r.engine.pool.cache.max_len for r in runs)))
        if f % stride == stride - 1:
            for t in timers.values():
                t.sample()

    # the bar shows on a terminal only (disable=None), and only for long sweeps
    total = rounds * len(specs)
    with tqdm(total=total, unit="frame", disable=True if total < 200 else None, file=sys.stderr) as bar:
        bar.set_description(f"{len(specs)} runs side by side")
        runs = run_interleaved(model, tok, specs, obs, on_frame=lambda: bar.update(1), after_round=after_round)
    for r in runs:
        r["preset"] = model.config.name
    compile_s = timers[True].setup_s if True in timers else None
    return runs, {compiled: t.result() for compiled, t in timers.items()}, compile_s


#: samples of each piece a benchmark takes between its rounds of frames
PIECE_SAMPLES = 30


def piece_timers(model, tok, args: argparse.Namespace, slot_len: int) -> dict[bool, PieceTimer]:
    """A timer of the pieces alone per compile mode the runs use (eager, and compiled if the
    device compiles), on the runs' slot length, as their engines run them."""
    c = model.config
    on_device = {m: resolve_compile(m, args.device).enabled for m in args.compile}
    timers = {}
    for compiled in sorted(set(on_device.values())):
        try:
            timers[compiled] = piece_timer(model, tok, cameras=args.cameras, compile=compiled,
                                           denoise_steps=denoise_sweep(args.denoise_steps, c)[0], slot_len=slot_len,
                                           round_steps=max(args.steps_per_frame))
        except (LibraryLoadError, CannotBuild):
            pass  # the compiled runs ran eager, and their rows say why
    return timers


def upper_bounds(model, runs: list[dict], components: dict) -> dict:
    """Each run's upper bound, from the pieces timed alone in its mode."""
    bounds = {}
    for S, n, k, compiled in sorted({(r["S"], r["N"], r["k"], r["compiled"]) for r in runs}):
        ox = [r for r in runs if r["setting"] == "oxygen" and (r["S"], r["N"], r["k"], r["compiled"]) == (S, n, k,
                                                                                                        compiled)]
        one = min(ox, key=lambda r: r["agents"]) if ox else None  # the bound is a frame of one observation
        per_frame = one["language_throughput_tps"] * one["frame_latency_ms"]["mean"] / 1e3 if one else None
        bounds[bound_key(S, n, k, compiled)] = upper_bound(components[compiled], S=S, k=k,
                                                           H=model.config.action_horizon, tokens_per_frame=per_frame)
    return bounds


def bound_key(S: int, n: int, k: int, compiled: bool = False) -> str:
    return f"S={S},N={n},k={k}" + (",compiled" if compiled else "")


def print_table(runs: list[dict], bounds: dict) -> None:
    """One row per run. ``obs``: observations per frame; ``T/obs``: median T over them; ``x1``: the
    median frame over the 1-agent run's (same other settings); ``f/robot``: H / mean T."""
    base = {_same_but_setting(r): r for r in runs if r["setting"] == "baseline"}
    head = f"{'setting':<10} {'comp':>4} {'N':>3} {'k':>3} {'S':>3} {'obs':>3} {'T mean':>8} {'T med':>8} " \
           f"{'T p99':>8} {'T/obs':>7} {'x1':>5} {'f (Hz)':>8} {'f/robot':>8} {'tau (tok/s)':>11} {'B':>5} " \
           f"{'copy B/fr':>9} {'speedup':>7} {'ideal':>6}"
    print(head)
    print("-" * len(head))
    eager_notes = set()  # why a compile mode ran eager: said once, below its first row
    for r in runs:
        bound = bounds.get(bound_key(r["S"], r["N"], r["k"], r["compiled"]))
        print(table_row(r, base.get(_same_but_setting(r)), bound))
        note = f"compile={r['compile']} ran eager: {r['compile_reason']}"
        if r["compile"] != "off" and not r["compiled"] and note not in eager_notes:
            eager_notes.add(note)
            print(f"  ({note}; said once for all rows)")
        if r["compiled"]:
            print(f"  ({r['setting']}: compiled in {r['compile_s']:.1f} s, {r['recompiles']} recompiles after warm-up)")
    for key, ub in bounds.items():
        print(f"upper bound {key}: T {ub['frame_latency_ms']:.2f} ms, f {ub['action_frequency_hz']:.1f} Hz, "
              f"tau {ub['language_throughput_tps']:.1f} tok/s")
    print(LEGEND)
    if note := early_end_note(runs):
        print(note)


def early_end_note(runs: list[dict]) -> str:
    """A note when the runs' requests ended well before N tokens, most of them at the model's
    end-of-sequence token (as the embedded default model's short answers do): the table then
    measures shorter requests than its N says; "" when they decoded (nearly) N each, or ended
    at their own lengths (``--arrivals random-length:A-B``)."""
    short = {}
    for r in runs:
        tokens, eos = r.get("tokens_per_request"), r.get("eos_share")
        if tokens is not None and tokens < EARLY_END * r["N"] and eos is not None and eos >= 0.5:
            short.setdefault(r["N"], []).append(tokens)
    if not short:
        return ""
    spans = {n: sorted({f"{x:.1f}" for x in (min(t), max(t))}, key=float) for n, t in short.items()}
    ends = ", ".join(f"{'-'.join(span)} tokens at N={n}" for n, span in sorted(spans.items()))
    return textwrap.fill(
        f"note: requests ended at the model's end-of-sequence token after {ends} on average: N counts little, the "
        "decode batch B stays small and a setting can beat 'ideal'. The paper's workload decodes N tokens per "
        "request: a model with random weights does (--preset tiny).", width=110, subsequent_indent="  ")


#: a run's requests that decoded fewer than this share of N on average are noted under the table
EARLY_END = 0.8

#: what the table's columns are, printed under it
LEGEND = """columns: comp compiled; N tokens per request at most (--max-decode); k decode steps per frame; S
  denoise steps; obs observations per frame; T frame time in ms (mean, median, p99); T/obs median T per
  observation; x1 median T over the 1-agent run's; f action frequency H/T (Hz); f/robot H over mean T, per
  robot; tau language throughput B*k/T (tokens/s); B mean decode batch; copy B/fr K/V bytes copied per frame;
  speedup f over baseline's; ideal baseline's T over the upper bound's (the most any setting could gain)"""


def print_components(components: dict) -> None:
    """The pieces alone, one line per mode: prefill, a denoise step, a decode step at each batch
    size and, compiled, a step of a decode call of k steps at each batch size."""
    for compiled, c in sorted(components.items()):
        steps = ", ".join(f"b{b} {t:.3f}" for b, t in c["decode_step_ms"].items())
        line = (f"pieces {'compiled' if compiled else 'eager'} (ms, slot length {c['slot_len']}): prefill "
                f"{c['prefill_ms']:.3f}, denoise step {c['denoise_step_ms']:.3f}, decode step {steps}")
        if c["decode_round_step_ms"]:
            line += ", decode step in a k-step call " + ", ".join(f"b{b} {t:.3f}" for b, t in c["decode_round_step_ms"].items())
        print(line)


def _same_but_setting(r: dict) -> tuple:
    return r["N"], r["k"], r["S"], r["compiled"], r["agents"]


def table_row(r: dict, b: dict | None, ub: dict | None) -> str:
    """``r``'s row of the table; ``b``: the baseline run it is compared with, ``ub``: its upper bound
    (one observation per frame: no ideal for several)."""
    speed = f"{r['action_frequency_hz'] / b['action_frequency_hz']:.2f}" if b else "-"
    ideal = f"{b['frame_latency_ms']['mean'] / ub['frame_latency_ms']:.2f}" if b and ub and r["agents"] == 1 else "-"
    ratio = "-" if r.get("frame_ratio_vs_1_agent") is None else f"{r['frame_ratio_vs_1_agent']:.2f}"
    comp = "on" if r["compiled"] else "off"
    t = r["frame_latency_ms"]
    return (f"{r['setting']:<10} {comp:>4} {r['N']:>3} {r['k']:>3} {r['S']:>3} {r['observations_per_frame']:>3.0f} "
            f"{t['mean']:>8.2f} {t['median']:>8.2f} {r['frame_latency_p99_ms']:>8.2f} "
            f"{r['per_observation_ms']:>7.2f} {ratio:>5} {r['action_frequency_hz']:>8.1f} "
            f"{r['action_frequency_per_robot_hz']:>8.1f} {r['language_throughput_tps']:>11.1f} "
            f"{r['avg_batch_size']:>5.2f} {r['kv_copy_bytes_per_frame']:>9.0f} {speed:>7} {ideal:>6}")


if __name__ == "__main__":
    sys.exit(main())

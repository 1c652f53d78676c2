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
import sys

from tqdm import tqdm

from ..core.benchmark import (Interrupted, RunSpec, compare_agents, denoise_sweep, piece_timer, run_interleaved,
                               shortest_prompt, synthetic_observations, upper_bound, with_prompt_tokens)
from ..core.engine import SETTINGS
from ..core.model.compile_setup import COMPILE_CHOICES, CannotBuild, resolve_compile, use_compile_cache
from ..core.model.load_probe import LibraryLoadError
from ..core.piece_timing import PieceTimer
from ..core.workloads import Workload
from .arguments import DefaultsHelp, non_negative_int, output_dir, output_file, plain, positive_float, positive_int
from .bench_load import expected_decoding_share, mark_load
from .bench_output import interrupted_note, model_description, model_fields, write_figures, write_json
from .bench_table import bound_key, mark_comparisons, print_components, print_table
from .common import add_model_args, check_cameras, keeps_freed_memory, load_model


def _once_each(values: list, text: str) -> list:
    """``values``, refused when one is given twice (its runs would run twice, side by side)."""
    twice = [str(v) for v in dict.fromkeys(v for v in values if values.count(v) > 1)]
    if twice:
        raise argparse.ArgumentTypeError(f"{', '.join(twice)} given twice in {text!r}: give each value once")
    return values


def int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return _once_each(values, text)


def setting_list(text: str) -> list[str]:
    values = [x for x in text.split(",") if x]
    if not values:
        raise argparse.ArgumentTypeError(f"no setting given (the value is empty); choose from {', '.join(SETTINGS)} (comma-separated)")
    bad = [x for x in values if x not in SETTINGS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown setting(s) {', '.join(bad)}; choose from {', '.join(SETTINGS)}")
    return _once_each(values, text)


def compile_list(text: str) -> list[str]:
    values = [x for x in text.split(",") if x]
    if not values or any(x not in COMPILE_CHOICES for x in values):
        raise argparse.ArgumentTypeError(f"expected a comma list of {', '.join(COMPILE_CHOICES)}, got {text!r}")
    return _once_each(values, text)


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
    p.add_argument("--cameras", type=positive_int, default=1,
                   help="cameras per observation (default: 1; oxygen-calibrate's default is the model's every "
                        "camera slot, whose longer prefill gives longer frames: give both the same --cameras to "
                        "compare them)")
    p.add_argument("--max-active", type=positive_int, default=16, help="language requests decoding at once")
    p.add_argument("--seed", type=non_negative_int, default=0,
                   help="seed of the synthetic scenes, the arrivals (poisson, random-length) and the action noise")
    p.add_argument("--compile", type=compile_list, default=["auto"], metavar="{on,off,auto}[,...]",
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
    check_args(p, args)
    return args


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What the options refuse together (argparse's error: exit status 2, naming them)."""
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
    obs = bench_observations(args, c, tok)
    print(f"model: {loaded.source} ({c.name}), H={c.action_horizon} actions per chunk, device {args.device}, "
          f"dtype {args.dtype}, threads {args.threads}", file=sys.stderr)
    if any(resolve_compile(m, args.device).enabled for m in args.compile):
        # nothing else is printed while they build (a walkthrough waited 5 minutes without a word)
        print(f"compiled runs: their packages not in the cache ({use_compile_cache()}) are built first, "
              "a few minutes when it is empty", file=sys.stderr)
    if args.pieces_only:
        return pieces_only(model, tok, args, loaded)
    if args.tick_probe:
        return tick_probe(model, tok, args, loaded)
    combos = run_combinations(args, denoise_sweep(args.denoise_steps, c))
    return sweep(model, tok, args, obs, combos, loaded)


def bench_observations(args: argparse.Namespace, c, tok) -> list:
    """The runs' synthetic observations, their prompts padded or cut to ``--prompt-tokens``
    (refused, with the range that works, outside what the template and ``max_token_len`` allow)."""
    obs = synthetic_observations(32, c.vision.image_size, args.cameras, seed=args.seed)
    n = args.prompt_tokens
    if not n:
        return obs
    shortest = shortest_prompt(obs, tok)
    if n > c.max_token_len:
        raise SystemExit(f"--prompt-tokens {n} exceeds the model's max_token_len {c.max_token_len}: give "
                         f"{shortest} to {c.max_token_len}")
    if n < shortest:
        raise SystemExit(f"--prompt-tokens {n}: the prompt's template and state alone take up to {shortest} tokens "
                         f"in these scenes: give {shortest} to {c.max_token_len} (the model's max_token_len)")
    try:
        return [with_prompt_tokens(o, tok, n) for o in obs]
    except ValueError as e:
        raise SystemExit(str(e)) from None


#: the exit status of a sweep cut short by Ctrl-C (the shell's 128 + SIGINT), what it measured kept: a
#: script that goes on to plot or compare its --json does not take a part of the runs for all of them
INTERRUPTED = 130


def sweep(model, tok, args: argparse.Namespace, obs: list, combos: list[tuple], loaded) -> int:
    """The table of runs: run them, print the table, write ``--json`` and ``--plot``. A Ctrl-C
    during the frames keeps what was measured (:class:`~oxygen_ros.core.benchmark.Interrupted`)
    and ends with :data:`INTERRUPTED`."""
    runs, components, components_compile_s, interrupted = run_all(model, tok, args, obs, combos)
    if not runs:
        print("oxygen-bench: interrupted before any frame was measured: nothing to keep", file=sys.stderr)
        return INTERRUPTED
    for r in runs:
        r.update(model_fields(loaded), prompt_tokens=args.prompt_tokens)
    compare_agents(runs)
    mark_load(runs)
    bounds = upper_bounds(model, runs, components)
    mark_comparisons(runs, bounds)
    result = {"interrupted": interrupted, "runs": runs, "upper_bound": bounds, "components": components.get(False),
              "components_compiled": components.get(True),
              # the compiled piece timer's own packages (other shapes than the runs'): part of a cold start's wait
              "components_compile_s": components_compile_s, "model": model_description(loaded, args)}
    print_table(runs, bounds)
    print_components(components)
    if components_compile_s is not None:
        print(f"  (the compiled pieces' own packages: loaded or built in {components_compile_s:.1f} s)")
    if interrupted:
        print(interrupted_note(runs, args.frames), file=sys.stderr)
    ok = write_json(result, args)
    if args.plot and interrupted:
        print(f"no figures: interrupted (--plot {args.plot} draws whole runs)", file=sys.stderr)
    elif args.plot:
        ok = write_figures(result, args) and ok
    return 1 if not ok else INTERRUPTED if interrupted else 0


def pieces_only(model, tok, args: argparse.Namespace, loaded) -> int:
    from .bench_pieces import print_pieces, run_pieces

    result = run_pieces(model, tok, args)
    print_pieces(result)
    result["model"] = model_description(loaded, args)
    return 0 if write_json(result, args) else 1


def tick_probe(model, tok, args: argparse.Namespace, loaded) -> int:
    from .bench_ticks import print_tick_probe, run_tick_probe

    result = run_tick_probe(model, tok, args)
    print_tick_probe(result)
    result["model"] = model_description(loaded, args)
    return 0 if write_json(result, args) else 1


def run_all(model, tok, args: argparse.Namespace, obs: list,
            combos: list[tuple]) -> tuple[list[dict], dict, float | None, bool]:
    """Every run of the sweep, in the order of ``combos``, side by side (``run_interleaved``: a frame
    of each in turn), and the pieces timed alone between their rounds of frames (:func:`piece_timers`):
    the runs' ratios (speedups, and against the upper bound) are measured under the same load, on a
    machine whose speed drifts. Returns the runs, the pieces' medians {compiled: components} and the
    seconds the compiled pieces' timer took to set up (loading or building packages of its own shapes;
    None: no compiled timer), and whether a Ctrl-C ended the frames (the runs and pieces then hold
    what was measured before it)."""
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
        try:
            runs, interrupted = run_interleaved(model, tok, specs, obs, on_frame=lambda: bar.update(1),
                                                after_round=after_round), False
        except Interrupted as stop:
            runs, interrupted = stop.runs, True
    compile_s = timers[True].setup_s if True in timers else None
    # a timer interrupted before its first sample has none to give
    components = {compiled: t.result() for compiled, t in timers.items() if t.times["prefill"]}
    return runs, components, compile_s, interrupted


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
    """Each run's upper bound, from the pieces timed alone in its mode: a frame of one observation,
    with the oxygen run's tokens per frame, decoding in as many of the frames as it did (without
    an oxygen run: k tokens, in the share of frames its requests would keep busy)."""
    bounds = {}
    for S, n, k, compiled in sorted({(r["S"], r["N"], r["k"], r["compiled"]) for r in runs}):
        if compiled not in components:
            continue  # interrupted before the pieces of this mode were timed
        same = [r for r in runs if (r["S"], r["N"], r["k"], r["compiled"]) == (S, n, k, compiled)]
        ox = [r for r in same if r["setting"] == "oxygen"]
        one = min(ox, key=lambda r: r["agents"]) if ox else None  # the bound is a frame of one observation
        per_frame = one["language_throughput_tps"] * one["frame_latency_ms"]["mean"] / 1e3 if one else None
        share = one["decoding_share"] if one else expected_decoding_share(same[0])
        bounds[bound_key(S, n, k, compiled)] = upper_bound(components[compiled], S=S, k=k,
                                                           H=model.config.action_horizon, tokens_per_frame=per_frame,
                                                           decoding_share=share)
    return bounds


if __name__ == "__main__":
    sys.exit(main())

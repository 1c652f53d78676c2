"""``oxygen-bench --pieces-only``: the model's pieces alone, eager and compiled, against plain matrix products.

For each compile mode of ``--compile`` (``on,off`` for both), the median time
of: the prefill of one observation (``--cameras`` cameras), one denoise step
(the median of S steps in one call, divided by S) and one decode step at
batch 1 and 8, on the slot length an engine with the default request sizes
uses (:class:`~oxygen_ros.core.piece_timing.PieceTimer`). Compiled, only
these buckets are built (a π0.5-sized bucket takes a minute or more). And
the prefill's own matrix products as plain ``torch.mm`` / ``bmm`` calls
(:mod:`~oxygen_ros.core.matmul_reference`; its attention's products as
batched ones): the prefill's achieved FLOP/s over theirs says how close it
runs to this machine's practical peak (printed too against the linear
layers' products alone, what the ratio counted until attention was in). Each of
the ``--repeats`` samples times every mode's pieces once, then the plain
products once, so that the ratio is measured at the same moments. No frames
are run, so a large model on a CPU takes minutes, not hours::

    oxygen-bench --pieces-only --preset pi05 --dtype bfloat16 --cameras 3 --threads 2 --compile on,off
"""

from __future__ import annotations

import argparse
import collections
import statistics

from ..core.benchmark import denoise_sweep, piece_timer, synthetic_observations
from ..core.engine_config import EngineConfig, slot_len
from ..core.matmul_reference import KINDS, ProductTimer, flops, kind, record_matmuls
from ..core.model.compile_setup import CannotBuild, resolve_compile
from ..core.model.load_probe import LibraryLoadError
from ..core.observation import make_prefix_batch

BATCHES = (1, 8)


def prefill_products(model, tokenizer, cameras: int):
    """The matrix products of one eager prefill of one observation, by shape."""
    c = model.config
    batch = make_prefix_batch(synthetic_observations(1, c.vision.image_size, cameras), tokenizer, c)
    cache = model.new_cache(slots=1, max_len=c.prefix_len)
    return record_matmuls(lambda: model.prefill(batch, cache, [[0]]))


def run_pieces(model, tokenizer, args: argparse.Namespace) -> dict:
    """The pieces under every compile mode asked for, and the prefill's matrix products."""
    c = model.config
    steps = denoise_sweep(args.denoise_steps, c)[0]
    # the slot length of an engine with the default request sizes
    slots = slot_len(EngineConfig(max_decode=max(args.max_decode), steps_per_frame=1,  # k: not in the length
                                  max_cameras=args.cameras), c)
    modes = dict.fromkeys(resolve_compile(mode, args.device).enabled for mode in args.compile)  # in order, once
    timers, not_run = {}, {}
    for compiled in modes:
        name = "compiled" if compiled else "eager"
        try:
            timers[name] = piece_timer(model, tokenizer, batch_sizes=BATCHES, cameras=args.cameras,
                                       denoise_steps=steps, compile=compiled, slot_len=slots, warm_all=False)
        except (LibraryLoadError, CannotBuild) as e:  # the other mode's figures still come out
            not_run[name] = str(e)
    products = prefill_products(model, tokenizer, args.cameras)
    reference = ProductTimer(products, device=args.device)
    reference_samples = {what: [] for what in KINDS}
    for _ in range(args.repeats):  # in turn: a sample of each mode's pieces, then of the plain products
        for timer in timers.values():
            timer.sample()
        for what, ms in reference.sample().items():
            reference_samples[what].append(ms)
    pieces = {name: timer.result() for name, timer in timers.items()}
    totals = [sum(parts) for parts in zip(*reference_samples.values())]
    reference_ms, linear_ms = statistics.median(totals), statistics.median(reference_samples["linear"])
    work = flops(products)
    for p in pieces.values():
        p["prefill_gflops_per_s"] = work / (p["prefill_ms"] / 1e3) / 1e9
        p["prefill_vs_matmuls"] = reference_ms / p["prefill_ms"]
        p["prefill_vs_linear_matmuls"] = linear_ms / p["prefill_ms"]
    attention = collections.Counter({shape: n for shape, n in products.items() if kind(shape[0]) == "attention"})
    return {"pieces": pieces, "not_run": not_run, "slot_len": slots, "denoise_steps": steps,
            "prefill_matmuls": {"gflop": work / 1e9, "ms": reference_ms, "layouts": reference.layouts,
                                "gflops_per_s": work / (reference_ms / 1e3) / 1e9, "shapes": len(products),
                                "attention_gflop": flops(attention) / 1e9, "linear_ms": linear_ms,
                                "attention_ms": statistics.median(reference_samples["attention"])}}


def print_pieces(result: dict) -> None:
    pieces, ref = result["pieces"], result["prefill_matmuls"]
    modes = list(pieces)
    print(f"pieces on a slot length of {result['slot_len']}, {result['denoise_steps']} denoise steps "
          f"(medians, ms)")
    both = set(modes) == {"eager", "compiled"}
    print(f"{'piece':<22}" + "".join(f"{m:>12}" for m in modes) + ("   eager/compiled" if both else ""))
    rows = [("prefill", lambda p: p["prefill_ms"]), ("denoise step", lambda p: p["denoise_step_ms"])]
    rows += [(f"decode step, batch {b}", lambda p, b=b: p["decode_step_ms"][b]) for b in BATCHES]
    for name, get in rows:
        values = [get(pieces[m]) for m in modes]
        ratio = f"   {get(pieces['eager']) / get(pieces['compiled']):.2f}x" if both else ""
        print(f"{name:<22}" + "".join(f"{v:>12.3f}" for v in values) + ratio)
    print(f"prefill: {ref['gflop']:.3g} GFLOP in {ref['shapes']} matrix-product shapes ({ref['attention_gflop']:.3g} "
          f"of them in attention); as plain products {ref['ms']:.1f} ms ({ref['gflops_per_s']:.0f} GFLOP/s; "
          f"linear layers {ref['linear_ms']:.1f} ms, attention {ref['attention_ms']:.1f} ms)")
    for m in modes:
        p = pieces[m]
        print(f"  {m}: {p['prefill_gflops_per_s']:.0f} GFLOP/s, {p['prefill_vs_matmuls']:.0%} of the plain products' "
              f"({p['prefill_vs_linear_matmuls']:.0%} of the linear layers' alone)")
    for m, why in result.get("not_run", {}).items():
        print(f"{m}: not run: {why}")

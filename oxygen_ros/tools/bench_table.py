"""The table ``oxygen-bench`` prints: one row per run, the upper bounds, the legend and notes.

Each run's ``speedup`` (its action frequency over the baseline's with the same N, k, S,
compile mode and agents) and ``ideal`` (the baseline's mean frame over the upper bound's,
1-agent runs only) are set in the run by :func:`mark_comparisons`, so that the JSON holds
what the table shows.
"""

from __future__ import annotations

import textwrap

from .bench_load import load_warnings


def bound_key(S: int, n: int, k: int, compiled: bool = False) -> str:
    return f"S={S},N={n},k={k}" + (",compiled" if compiled else "")


def _same_but_setting(r: dict) -> tuple:
    return r["N"], r["k"], r["S"], r["compiled"], r["agents"]


def speedup(r: dict, b: dict | None) -> float | None:
    """``r``'s action frequency over its baseline run ``b``'s (None: no baseline)."""
    return r["action_frequency_hz"] / b["action_frequency_hz"] if b else None


def ideal(r: dict, b: dict | None, ub: dict | None) -> float | None:
    """The baseline's mean frame over the upper bound's: the most any setting could gain
    (None: no baseline, no bound, or several observations a frame, which the bound is not)."""
    if not (b and ub and r["agents"] == 1):
        return None
    return b["frame_latency_ms"]["mean"] / ub["frame_latency_ms"]


def mark_comparisons(runs: list[dict], bounds: dict) -> None:
    """Set each run's ``speedup`` and ``ideal`` (None where the table shows '-')."""
    base = {_same_but_setting(r): r for r in runs if r["setting"] == "baseline"}
    for r in runs:
        b = base.get(_same_but_setting(r))
        r["speedup"] = speedup(r, b)
        r["ideal"] = ideal(r, b, bounds.get(bound_key(r["S"], r["N"], r["k"], r["compiled"])))


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table_row(r: dict, b: dict | None, ub: dict | None) -> str:
    """``r``'s row of the table; ``b``: the baseline run it is compared with, ``ub``: its upper bound
    (one observation per frame: no ideal for several). A saturated run's row ends so."""
    ratio = _ratio(r.get("frame_ratio_vs_1_agent"))
    comp = "on" if r["compiled"] else "off"
    t = r["frame_latency_ms"]
    row = (f"{r['setting']:<10} {comp:>4} {r['N']:>3} {r['k']:>3} {r['S']:>3} {r['observations_per_frame']:>3.0f} "
           f"{t['mean']:>8.2f} {t['median']:>8.2f} {r['frame_latency_p99_ms']:>8.2f} "
           f"{r['per_observation_ms']:>7.2f} {ratio:>5} {r['action_frequency_hz']:>8.1f} "
           f"{r['action_frequency_per_robot_hz']:>8.1f} {r['language_throughput_tps']:>11.1f} "
           f"{r['avg_batch_size']:>5.2f} {r['kv_copy_bytes_per_frame']:>9.0f} {r.get('queued_at_end', '-'):>5} "
           f"{r.get('requests_rejected', '-'):>4} {_ratio(speedup(r, b)):>7} {_ratio(ideal(r, b, ub)):>6}")
    return row + ("  saturated" if r.get("saturated") else "")


HEAD = (f"{'setting':<10} {'comp':>4} {'N':>3} {'k':>3} {'S':>3} {'obs':>3} {'T mean':>8} {'T med':>8} "
        f"{'T p99':>8} {'T/obs':>7} {'x1':>5} {'f (Hz)':>8} {'f/robot':>8} {'tau (tok/s)':>11} {'B':>5} "
        f"{'copy B/fr':>9} {'queue':>5} {'rej':>4} {'speedup':>7} {'ideal':>6}")


def compile_note(r: dict) -> str:
    """How a compiled run's packages came: compiled here, or loaded from the cache (in 0.0 s)."""
    packages, built, seconds = r.get("packages", 0), r.get("packages_built", 0), r["compile_s"]
    if built == 0:
        how = f"its {packages} packages loaded from the cache in {seconds:.1f} s"
    elif built == packages:
        how = f"its {packages} packages compiled in {seconds:.1f} s"
    else:
        how = f"{built} of its {packages} packages compiled, the others loaded from the cache, in {seconds:.1f} s"
    return f"  ({r['setting']}: {how}, {r['recompiles']} recompiles after warm-up)"


def print_table(runs: list[dict], bounds: dict) -> None:
    """One row per run. ``obs``: observations per frame; ``T/obs``: median T over them; ``x1``: the
    median frame over the 1-agent run's (same other settings); ``f/robot``: H / mean T."""
    base = {_same_but_setting(r): r for r in runs if r["setting"] == "baseline"}
    print(HEAD)
    print("-" * len(HEAD))
    eager_notes = set()  # why a compile mode ran eager: said once, below its first row
    for r in runs:
        bound = bounds.get(bound_key(r["S"], r["N"], r["k"], r["compiled"]))
        print(table_row(r, base.get(_same_but_setting(r)), bound))
        note = f"compile={r['compile']} ran eager: {r['compile_reason']}"
        if r["compile"] != "off" and not r["compiled"] and note not in eager_notes:
            eager_notes.add(note)
            print(f"  ({note}; said once for all rows)")
        if r["compiled"]:
            print(compile_note(r))
    several = any(r["agents"] > 1 for r in runs)
    for key, ub in bounds.items():
        print(bound_line(key, ub, several))
    print(LEGEND)
    if note := early_end_note(runs):
        print(note)
    for line in load_warnings(runs):
        print(line)


def bound_line(key: str, ub: dict, several_agents: bool) -> str:
    """The upper bound's line: said to be a frame of one observation when some runs serve several."""
    line = (f"upper bound {key}: T {ub['frame_latency_ms']:.2f} ms, f {ub['action_frequency_hz']:.1f} Hz, "
            f"tau {ub['language_throughput_tps']:.1f} tok/s")
    if ub.get("decoding_share", 1.0) < 1.0:
        line += f" (decoding in {ub['decoding_share']:.0%} of the frames, as the runs did)"
    if several_agents:
        line += " (a frame of 1 observation: the ideal of 1-agent runs only)"
    return line


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
  robot; tau tokens the measured frames produced over their time (tokens/s: B*k/T plus each new request's
  first token, which its prefill chooses; baseline decodes a request's N tokens in the frame it starts);
  B mean decode batch; copy B/fr K/V bytes copied per frame; queue requests waiting for a decode slot at
  the end (--max-active); rej requests rejected, the queue full; speedup f over baseline's; ideal
  baseline's T over the upper bound's (the most any setting could gain)"""


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

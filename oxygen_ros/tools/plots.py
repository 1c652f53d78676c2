"""PNG figures of an oxygen-bench result (matplotlib, no display needed)."""

from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def write_plots(result: dict, out_dir: pathlib.Path) -> list[pathlib.Path]:
    """The figures written: the trade-off always; the speedups over ``baseline`` only when the
    runs include baseline and another setting (else they would be empty axes)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = result["runs"]
    paths = [_tradeoff(runs, out_dir / "frequency_vs_throughput.png")]
    settings = {r["setting"] for r in runs}
    if "baseline" in settings and len(settings) > 1:
        paths += [_speedup(runs, out_dir / "speedup_vs_N.png", by="N"),
                  _speedup(runs, out_dir / "speedup_vs_k.png", by="k")]
    return paths


def _tradeoff(runs, path):
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for setting in dict.fromkeys(r["setting"] for r in runs):
        pts = sorted((r["language_throughput_tps"], r["action_frequency_hz"], r["N"], r["k"])
                     for r in runs if r["setting"] == setting)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o", label=setting)
        for x, y, n, k in pts:
            ax.annotate(f"N{n} k{k}", (x, y), fontsize=6, alpha=0.7)
    _mark_saturated(ax, [(r["language_throughput_tps"], r["action_frequency_hz"]) for r in runs if r.get("saturated")])
    ax.set_xlabel("language throughput (tokens/s)")
    ax.set_ylabel("action frequency (Hz)")
    ax.set_title("Action frequency vs language throughput")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes, off the points
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def _speedup(runs, path, by):
    base = {(r["N"], r["k"], r["S"]): r for r in runs if r["setting"] == "baseline"}
    other = "k" if by == "N" else "N"
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for setting in [s for s in dict.fromkeys(r["setting"] for r in runs) if s != "baseline"]:
        for fixed in sorted({r[other] for r in runs}):
            pts = sorted((r[by], r["action_frequency_hz"] / base[(r["N"], r["k"], r["S"])]["action_frequency_hz"])
                         for r in runs if r["setting"] == setting and r[other] == fixed
                         and (r["N"], r["k"], r["S"]) in base)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"{setting} {other}={fixed}")
    _mark_saturated(ax, [(r[by], r["action_frequency_hz"] / base[(r["N"], r["k"], r["S"])]["action_frequency_hz"])
                         for r in runs if r.get("saturated") and r["setting"] != "baseline"
                         and (r["N"], r["k"], r["S"]) in base])
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel(by)
    ax.set_ylabel("action-frequency speedup over baseline")
    ax.set_title(f"Speedup over baseline against {by}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: over them it hid points
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


#: the legend of the ring around a saturated run's point
SATURATED = "saturated: more requests than its decode slots took (see the table's warning)"


def _mark_saturated(ax, points: list[tuple[float, float]]) -> None:
    """A red ring around each point of a saturated run (``saturated`` in its JSON: more requests
    came than ``--max-active`` slots could take, so part of the language work was never done and
    the point is not comparable with the others)."""
    if points:
        ax.plot([p[0] for p in points], [p[1] for p in points], "o", markersize=13, markerfacecolor="none",
                markeredgecolor="red", markeredgewidth=1.2, label=SATURATED)

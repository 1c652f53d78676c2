"""Whether an ``oxygen-bench`` run measured a server that keeps up with its requests.

Under ``oxygen`` a request holds a decode slot over several frames: its prefill chooses
its first token, then it decodes ``k`` tokens a frame, so a request of ``N`` tokens stays
``ceil((N - 1) / k)`` frames. With ``R`` requests arriving a frame, about ``R x (N - 1) / k``
are decoding at once (Little's law); past ``--max-active`` the rest wait in the queue, which
grows frame after frame, and the window measures part of the language work only: fewer
requests finish, the batch B sits at ``--max-active`` and request latencies grow with the
run's length. ``shared_kv`` holds a slot for one frame (it decodes a request whole), so it
saturates only when more than ``--max-active`` requests come in one frame; ``baseline`` and
``parallel`` start every request in the frame it comes (no limit).

A run is *saturated* when it needs more slots than ``--max-active``, or its queue grew over
the measured frames, or a request was rejected (the queue full). Its warm-up is *short*
when ``--warmup`` is fewer frames than a request decodes for: the batch was still filling
when measuring began, so B and tau depend on ``--warmup``.
"""

from __future__ import annotations

import math
import textwrap

from ..core.workloads import Workload

#: the settings whose requests wait for one of ``--max-active`` decode slots
SLOT_LIMITED = ("shared_kv", "oxygen")


def frames_per_request(setting: str, tokens: float, k: int) -> int:
    """Frames a request of ``tokens`` tokens decodes for under ``setting`` at ``k`` steps a frame."""
    if setting != "oxygen":
        return 1  # the others decode a request whole in the frame it starts
    return max(1, math.ceil((tokens - 1) / k))


def _arrivals(run: dict, setting: str | None = None) -> tuple[float, int]:
    """(requests arriving a frame, frames each decodes for) of ``run``'s arrivals, N and k, under
    ``setting`` (default: the run's)."""
    workload = Workload.parse(run["arrivals"])
    frames = frames_per_request(setting or run["setting"], workload.mean_tokens(run["N"]), run["k"])
    return workload.requests_per_frame, frames


def slots_needed(run: dict) -> float | None:
    """Decode slots ``run``'s arrivals keep busy at once, on average (None: its setting has no limit)."""
    if run["setting"] not in SLOT_LIMITED:
        return None
    rate, frames = _arrivals(run)
    return rate * frames


def expected_decoding_share(run: dict) -> float:
    """The share of frames an ``oxygen`` run of ``run``'s N, k and arrivals would decode in: the
    requests decoding at once, on average, capped at every frame (0 when none arrive)."""
    rate, frames = _arrivals(run, "oxygen")
    return min(1.0, rate * frames)


def mark_load(runs: list[dict]) -> None:
    """Set each run's ``slots_needed``, ``saturated`` and ``warmup_short`` (see the module)."""
    for r in runs:
        need = slots_needed(r)
        r["slots_needed"] = need
        r["saturated"] = need is not None and (need > r["max_active"] or r["requests_rejected"] > 0
                                               or r["queued_at_end"] > r["queued_at_start"])
        fill = _filling_frames(r)
        r["warmup_short"] = fill > 1 and r["warmup"] < fill


def _filling_frames(run: dict) -> int:
    """Frames a batch takes to fill: as many as a request decodes for (none when no requests come)."""
    rate, frames = _arrivals(run)
    return frames if rate else 0


def _name(r: dict) -> str:
    comp = ", compiled" if r.get("compiled") else ""
    agents = f", {r['agents']} agents" if r.get("agents", 1) > 1 else ""
    return f"{r['setting']} N={r['N']} k={r['k']} S={r['S']}{agents}{comp}"


def saturation_warning(r: dict) -> str:
    """The warning line of a saturated run: what it needed, what happened, what helps."""
    need, (rate, frames) = r["slots_needed"], _arrivals(r)
    helps = math.ceil(need)
    text = (f"warning: {_name(r)} is saturated: {rate:g} request(s) a frame, each decoding for {frames} "
            f"frame(s), keep about {need:.1f} decode slots busy against --max-active {r['max_active']}; "
            f"the queue went from {r['queued_at_start']} to {r['queued_at_end']} waiting, "
            f"{r['requests_rejected']} rejected, {r['requests_finished']} of {r['requests_arrived']} requests "
            "finished in the window. Its speedup, B, tau and request latency are an overloaded server's: part of "
            "the language work asked for is never done in the window, so they are not comparable with baseline's, "
            "which does it all. ")
    if need > r["max_active"]:
        text += (f"Helps: --max-active {helps} or more (>= arrivals per frame x (N-1)/k), a larger "
                 "--steps-per-frame, a smaller --max-decode or fewer --arrivals.")
    else:
        text += "Helps: a larger --max-active, or fewer --arrivals (bursts fill the slots)."
    return textwrap.fill(text, width=110, subsequent_indent="  ")


def warmup_warning(r: dict) -> str:
    """The warning line of a run whose warm-up ended before its batch could fill."""
    frames = _filling_frames(r)
    return textwrap.fill(
        f"warning: {_name(r)}: --warmup {r['warmup']} is shorter than the {frames} frames a request decodes for "
        "(about (N-1)/k): the batch was still filling when measuring began, so its B and tau depend on "
        f"--warmup. Helps: --warmup {frames} or more.", width=110, subsequent_indent="  ")


def load_warnings(runs: list[dict]) -> list[str]:
    """A warning per saturated run and per run whose warm-up was short (runs marked by :func:`mark_load`)."""
    lines = [saturation_warning(r) for r in runs if r["saturated"]]
    return lines + [warmup_warning(r) for r in runs if r["warmup_short"]]

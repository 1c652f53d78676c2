"""The ``robots`` section of ``oxygen-agent --report`` when the inference node serves several robots.

With ``robots:=left,right`` the report gets ``robots: {name: {...}}``, per robot:

* ``tick_rate_hz``, ``underruns``, ``actions_published``, ``ticks_waiting`` -
  node side, that robot's control ticks over the measurement window
  (``InferenceNode.tick_counts(robot)``; ``ticks_waiting``: before the robot's
  first chunk, so a robot that never got one shows its ticks there, not as
  underruns);
* ``tick_jitter_p50_ms`` / ``_p99_ms``, ``obs_to_action_p50_ms`` / ``_p99_ms``,
  ``actions_received`` - subscriber side, measured by the arrival probe in its
  own process on that robot's ``/<robot>/...`` actions and observation topics
  (``None`` when the probe could not start);
* ``action_frequency_hz``, ``chunk_age_ms``, ``tokens_per_s``, ``frame_share``
  - the robot's figures (``InferenceNode.diagnostics(robot)``, what its
  ``oxygen_inference: robot <name>`` status on ``/diagnostics`` carries) at the
  end of the window (``frame_share`` only with more than one robot).

The top-level figures then cover every robot: counts are totals,
``tick_rate_hz`` is per robot (total ticks / robots / active seconds in the window), the jitter and
latency percentiles are over every robot's arrivals together.
"""

from __future__ import annotations

import math
from typing import Any

from ..core.stats import percentile

DIAGNOSTIC_KEYS = ("action_frequency_hz", "chunk_age_ms", "tokens_per_s", "frame_share")
COUNTS = ("ticks", "published", "underruns", "waiting")


def active_seconds(start, end) -> float:
    """The seconds the node was active (its control tick running) in the window (0.0: no window)."""
    return end["active_s"] - start["active_s"] if start else 0.0


def robot_names(node) -> tuple[str, ...]:
    """The robots the inference node serves (empty: one robot on its configured topics)."""
    return tuple(r for r in (getattr(node, "robot_names", None) or ()) if r)


def robot_diagnostics(node, robots: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Each robot's figures now (those of :data:`DIAGNOSTIC_KEYS` it has)."""
    out = {}
    for robot in robots:
        d = node.diagnostics(robot)
        out[robot] = {key: d[key] for key in DIAGNOSTIC_KEYS if key in d}
    return out


def robot_ticks(node, robots: tuple[str, ...]) -> dict[str, dict[str, int]]:
    """Each robot's control-tick counts now."""
    return {r: node.tick_counts(r) for r in robots}


def total_ticks(node, robots: tuple[str, ...], per_robot: dict[str, dict[str, int]] | None = None) -> dict[str, Any]:
    """The node's tick counts: its own with one robot, summed over ``robots`` otherwise
    (over ``per_robot``, a :func:`robot_ticks` snapshot, when given: the total then
    equals the sum of that snapshot even while ticks go on)."""
    if not robots:
        return node.tick_counts()
    per = (robot_ticks(node, robots) if per_robot is None else per_robot).values()
    return {key: sum(int(c.get(key, 0)) for c in per) for key in COUNTS}


def in_window(stream: dict[str, Any] | None, t0: float, t1: float) -> tuple[list[float], list[tuple]]:
    """One probed stream's ActionChunk arrivals and (frame, seq, obs->action ms) inside ``t0 .. t1``."""
    if stream is None:
        return [], []
    arrivals = [t for t in stream["arrivals"] if t0 <= t <= t1]
    latencies = sorted((f, seq, (t - t_obs) * 1e3) for f, (seq, t, t_obs) in stream["first_actions"].items()
                       if t_obs is not None and t0 <= t <= t1)
    return arrivals, latencies


def jitter_ms(period_s: float | None, arrivals: list[float]) -> list[float]:
    """``|inter-arrival - control period|`` of consecutive arrivals, in ms (none without a
    period: ``control_rate_hz`` changed in the window)."""
    if period_s is None:
        return []
    return [abs((b - a) - period_s) * 1e3 for a, b in zip(arrivals, arrivals[1:])]


def robots_section(robots: tuple[str, ...], period_s: float | None, probed: dict | None, start,
                   end) -> dict[str, dict[str, Any]]:
    """The report's ``robots`` section (see the module doc); ``start``/``end``: the
    measurement window's ends, with ``robot_ticks`` (and ``robot_diag`` at the end)."""
    active = active_seconds(start, end)
    out = {}
    for robot in robots:
        before = start["robot_ticks"][robot] if start else {}
        after = end["robot_ticks"][robot]

        def count(key: str) -> int:
            return int(after.get(key, 0)) - int(before.get(key, 0))

        stream = probed.get(robot) if probed is not None and start is not None else None
        arrivals, latencies = in_window(stream, start["t"], end["t"]) if stream is not None else ([], [])
        jitter, lat = jitter_ms(period_s, arrivals), [x for _, _, x in latencies]
        d = end.get("robot_diag", {}).get(robot, {})
        out[robot] = {
            "tick_rate_hz": round(count("ticks") / active, 3) if active > 0 else None,
            "underruns": count("underruns"), "actions_published": count("published"),
            "ticks_waiting": count("waiting"),
            "tick_jitter_p50_ms": pct(jitter, 50), "tick_jitter_p99_ms": pct(jitter, 99),
            "obs_to_action_p50_ms": pct(lat, 50), "obs_to_action_p99_ms": pct(lat, 99),
            "actions_received": len(arrivals) if stream is not None else None,
            **{key: number(d.get(key)) for key in DIAGNOSTIC_KEYS},
        }
    return out


def pooled(period_s: float | None, probed: dict, robots: tuple[str, ...], t0: float, t1: float) -> tuple[list, list, int]:
    """Every robot's jitter values and latencies ((robot, frame, seq, ms)) in the window together,
    and the arrivals counted."""
    jitter, latencies, received = [], [], 0
    for robot in robots:
        arrivals, lat = in_window(probed.get(robot), t0, t1)
        jitter += jitter_ms(period_s, arrivals)
        latencies += [(robot, *x) for x in lat]
        received += len(arrivals)
    return jitter, latencies, received


def summary_table(report: dict[str, Any]) -> list[str]:
    """The printed per-robot table of a report with a ``robots`` section (no lines without)."""
    robots = report.get("robots") or {}
    if not robots:
        return []
    columns = ("tick_rate_hz", "tick_jitter_p99_ms", "obs_to_action_p99_ms", "underruns", "actions_published",
               "frame_share", "tokens_per_s")
    width = max(len("robot"), *(len(r) for r in robots))
    lines = ["robot".ljust(width) + "  " + "  ".join(columns)]
    for robot, figures in robots.items():
        cells = [_cell(figures.get(c)).rjust(len(c)) for c in columns]
        lines.append(robot.ljust(width) + "  " + "  ".join(cells))
    return lines


def _cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def number(value) -> float | None:
    """A diagnostic value (a string) as a number; None when it is not one."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else round(v, 3)


def pct(values, q):
    v = percentile(values, q)
    return None if math.isnan(v) else round(v, 3)

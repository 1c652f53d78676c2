"""The inference node's diagnostic status: level and message from its figures."""

from __future__ import annotations

import math
from typing import Any

from diagnostic_msgs.msg import DiagnosticStatus

#: Counters published on /diagnostics as they are (``questions_rejected`` after the 11th).
COUNTED = ("ticks_faulted", "actions_non_finite", "frames", "language_frames", "frame_errors",
           "observations_received", "observations_superseded", "observations_stale", "observations_invalid",
           "instructions_truncated", "questions_received", "questions_truncated", "actions_published",
           "text_tokens_published", "publish_errors")
#: Counters whose increase since the last status is reported.
NEW_SINCE_LAST = ("underruns", "missed_ticks", "observations_stale", "hold_ticks", "frame_errors",
                  "actions_non_finite", "recompiles")


def _problems(d: dict, new: dict, max_observation_age: float) -> list[str]:
    problems = []
    if d["faulted"]:
        problems.append(f"action output stopped: {d['consecutive_failures']} frames failed in a row "
                        f"(last: {d['last_failure']})")
    if new["underruns"]:
        problems.append(f"{new['underruns']} underruns")
    if new["hold_ticks"]:
        problems.append(f"holding the last action ({new['hold_ticks']} ticks)")
    age = d["observation_age_ms"]
    if (d["observations_received"] and max_observation_age > 0 and not math.isnan(age)
            and age > max_observation_age * 1e3):
        problems.append(f"no fresh observation for {age / 1e3:.1f} s (camera drop-out?)")
    if new["observations_stale"]:
        problems.append(f"{new['observations_stale']} stale observations not used")
    if new["missed_ticks"]:
        problems.append(f"{new['missed_ticks']} ticks missed (timer late)")
    if d["frames"] == 0:
        problems.append("no observation frame yet")
    if new["frame_errors"]:
        problems.append(f"{new['frame_errors']} frame errors")
    if new["actions_non_finite"]:
        problems.append(f"{new['actions_non_finite']} chunks with non-finite actions dropped")
    if new["recompiles"]:
        problems.append(f"{new['recompiles']} graphs compiled after warm-up (a shape outside the buckets)")
    if d["k"] < d["k_max"]:
        problems.append(f"language budget k={d['k']} of {d['k_max']} (frames near the "
                        f"{d['frame_deadline_ms']:.0f} ms deadline)")
    f = d["action_frequency_hz"]
    if not math.isnan(f) and f < d["control_rate_hz"]:
        problems.append(f"action frequency {f:.0f} Hz below the control rate")
    return problems


class StatusReporter:
    """(level, message) of each status: ERROR when the action output is stopped, WARN
    for what happened since the last status (underruns, stale observations, holds,
    frame errors, a shrunken language budget, ...), else OK."""

    def __init__(self) -> None:
        self._previous = {key: 0 for key in NEW_SINCE_LAST}

    def status(self, d: dict, max_observation_age: float) -> tuple:
        new = {key: d[key] - self._previous.get(key, 0) for key in NEW_SINCE_LAST}
        self._previous = {key: d[key] for key in NEW_SINCE_LAST}
        problems = _problems(d, new, max_observation_age)
        if d["faulted"]:
            level = DiagnosticStatus.ERROR
        else:
            level = DiagnosticStatus.WARN if problems else DiagnosticStatus.OK
        message = "; ".join(problems) if problems else (
            f"f={d['action_frequency_hz']:.0f} Hz, frame {d['frame_latency_ms']:.1f} ms, "
            f"{d['tokens_per_s']:.0f} tok/s")
        return level, message


def format_value(v: Any) -> str:
    """A diagnostics value as a KeyValue string."""
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.3f}"
    return str(v)

"""The inference node's diagnostics: its figures, the status (level and message) they give, the message."""

from __future__ import annotations

import math
import os
import time
from typing import Any

from diagnostic_msgs.msg import DiagnosticStatus

from ..core.stats import action_frequency, percentile
from ..core.throttle import Throttle


def inactive_kept(d: dict) -> str:
    """What a paused (inactive) node keeps, from its status figures ``d`` (ints, or the strings
    of /diagnostics): the questions waiting for activate, the requests decoding."""
    return (f"{d.get('questions_waiting', 0)} questions waiting (answered after activate), "
            f"{d['active_requests']} requests kept")


#: Counters published on /diagnostics as they are (``questions_rejected`` after the 11th).
COUNTED = ("ticks_faulted", "actions_non_finite", "frames", "language_frames", "frame_errors",
           "observations_received", "observations_superseded", "observations_stale", "observations_invalid",
           "instructions_truncated", "questions_received", "questions_truncated", "questions_same_client_id",
           "actions_published", "text_tokens_published", "publish_errors", "chunks_from_frame_end", "descriptions_skipped")
#: Counters whose increase since the last status is reported.
NEW_SINCE_LAST = ("underruns", "missed_ticks", "observations_stale", "hold_ticks", "frame_errors",
                  "actions_non_finite", "recompiles", "chunks_from_frame_end", "observations_invalid")


#: The frame worker's load (its busy fraction) from which underruns are blamed on the frames' pace.
OVERLOADED = 0.85
#: Seconds after start with no observation before the console warns.
NO_OBSERVATION_WARN_S = 5.0
#: Seconds between two console warnings of one kind.
CONSOLE_PERIOD_S = 5.0
#: Problems that are also warned on the console (throttled): the ones a user must see without
#: watching /diagnostics. Frame failures and a stopped action output are logged where they happen.
CONSOLE = ("same_name", "unserved_inputs", "underruns", "no_observation", "observation_age", "missed_ticks",
           "recompiles", "control_failure", "control_silent", "worker_failure", "frame_stalled")
#: With several robots, the console kinds said once for the node, not once per robot: the
#: node's own (its name, its inputs), not a robot's.
NODE_CONSOLE = ("same_name", "unserved_inputs")
#: With several robots, the console kinds said once per robot: the others.
ROBOT_CONSOLE = tuple(kind for kind in CONSOLE if kind not in NODE_CONSOLE)
#: Seconds the control process may go without a tick while active before the status is ERROR
#: (at least :data:`CONTROL_SILENT_PERIODS` control periods: at a slow ``control_rate_hz`` a
#: tick is that far apart anyway).
CONTROL_SILENT_S = 1.0
CONTROL_SILENT_PERIODS = 3
#: A frame in flight for longer than the most of these is stalled: seconds, frame deadlines,
#: and the worker's own recent frames (p99), so that a model slow on this machine is not stalled.
STALLED_S, STALLED_DEADLINES, STALLED_FRAMES = 2.0, 10, 5
#: Problems that make the status ERROR (no action goes out); the others make it WARN.
ERRORS = ("control_failure", "control_silent", "faulted", "worker_failure", "frame_stalled")


def stalled_after_s(d: dict) -> float:
    """Seconds after which the frame in flight counts as stalled (see :data:`STALLED_S`)."""
    p99 = d.get("frame_latency_p99_ms", float("nan"))
    return max(STALLED_S, STALLED_DEADLINES * d["frame_deadline_ms"] / 1e3,
               0.0 if math.isnan(p99) else STALLED_FRAMES * p99 / 1e3)


def _problems(d: dict, new: dict, max_observation_age: float) -> list[tuple[str, str]]:
    """(kind, text) of every problem in the figures ``d`` (``new``: counts since the last status):
    the action output's, then the inputs', then the frames'."""
    return _output_problems(d, new) + _input_problems(d, new, max_observation_age) + _frame_problems(d, new)


def _output_problems(d: dict, new: dict) -> list[tuple[str, str]]:
    problems = []
    if d.get("same_name_nodes"):
        problems.append(("same_name", f"{d['same_name_nodes']} other node(s) named {d['node_name']} on this ROS "
                                      f"network (ROS_DOMAIN_ID {os.environ.get('ROS_DOMAIN_ID') or 0}): another "
                                      "agent: a parameter, lifecycle or Ask call by that name reaches either; "
                                      "give each set-up its own ROS_DOMAIN_ID, or a namespace (a node killed moments "
                                      "ago stays listed until DDS forgets it)"))
    if d.get("other_action_publishers"):
        problems.append(("same_name", f"{d['other_action_publishers']} other publisher(s) on {d['actions_topics']}: "
                                      "another agent or a bag playing it, and a robot takes either's actions; give "
                                      "each set-up its own ROS_DOMAIN_ID or namespace (a node killed moments ago "
                                      "stays listed until DDS forgets it)"))
    if d.get("control_failure"):
        problems.append(("control_failure", f"control tick stopped: {d['control_failure']}; no action goes out"))
    elif d.get("control_silent_s", 0.0) > max(CONTROL_SILENT_S, CONTROL_SILENT_PERIODS / d["control_rate_hz"]):
        problems.append(("control_silent", f"control tick silent for {d['control_silent_s']:.1f} s: the control "
                                           "process runs but does not tick (stopped, or starved of CPU); no "
                                           "action goes out"))
    if d.get("worker_failure"):
        problems.append(("worker_failure", f"frame worker stopped: {d['worker_failure']}; no frame runs, no new "
                                           "action goes out"))
    running = d.get("frame_running_s", 0.0)
    if running > stalled_after_s(d):
        usual = "" if math.isnan(d["frame_latency_ms"]) else f" (frames take {d['frame_latency_ms']:.0f} ms)"
        problems.append(("frame_stalled", f"the frame in flight has run {running:.1f} s{usual}: no new action goes "
                                          "out until it ends (a stalled device, a compile, a lock held?)"))
    if d["faulted"]:
        problems.append(("faulted", f"action output stopped: {d['consecutive_failures']} frames failed in a row "
                                    f"(last: {d['last_failure']})"))
    if new["underruns"]:
        problems.append(("underruns", f"{new['underruns']} underruns{_overload(d) or _late_observations(d)}"))
    if new["hold_ticks"]:
        problems.append(("hold_ticks", f"holding the last action ({new['hold_ticks']} ticks)"))
    return problems


def _input_problems(d: dict, new: dict, max_observation_age: float) -> list[tuple[str, str]]:
    problems = []
    if d.get("unserved_inputs"):
        problems.append(("unserved_inputs", f"no robot takes these inputs: {d['unserved_inputs']}; with robots "
                                            "named (parameter robots), the node takes each robot's under its name: "
                                            "send there"))
    if new["observations_invalid"]:
        problems.append(("observations_invalid", f"{new['observations_invalid']} observations refused (the log "
                                                 "says why)"))
    age, stale = d["observation_age_ms"], new["observations_stale"]
    whose = f" from robot {d['observation_age_robot']}" if d.get("observation_age_robot") else ""
    if (d["observations_received"] and max_observation_age > 0 and not math.isnan(age)
            and age > max_observation_age * 1e3 and not new["observations_invalid"] and not stale):
        # (refused, or coming too old: not a drop-out)
        problems.append(("observation_age", f"no fresh observation{whose} for {_duration(age)} (a camera "
                                             "drop-out, or a state missing: see the camera node's status)"))
    if new["chunks_from_frame_end"]:
        problems.append(("chunks_from_frame_end", f"{new['chunks_from_frame_end']} chunks started at the frame's end: "
                                                  "their observations' stamps were too old or not on this clock"))
    if stale:  # they come, but too old to act on: the stamps, the way, or the limit
        newest = "" if math.isnan(age) else f"; the newest{whose} {_duration(age)} old"
        problems.append(("observations_stale", f"{stale} stale observations not used: older than max_observation_age "
                                               f"({_duration(max_observation_age * 1e3)}) when a frame would start "
                                               f"from them{newest} (a slow camera side or network, a sender's clock "
                                               "behind this node's, or the limit too small: the log says how old each "
                                               "was on arrival)"))
    if new["missed_ticks"]:
        problems.append(("missed_ticks", f"{new['missed_ticks']} ticks missed (timer late)"))
    if not d["observations_received"]:  # (observations whose frames all failed are told as failures)
        problems.append(("no_observation", "no observation received yet"))
    return problems


def _duration(ms: float) -> str:
    """``ms`` milliseconds in words: "47.8 ms" under a second, "2.5 s" from one on."""
    return f"{ms:.1f} ms" if ms < 1e3 else f"{ms / 1e3:.1f} s"


def _frame_problems(d: dict, new: dict) -> list[tuple[str, str]]:
    problems = []
    if new["frame_errors"]:
        problems.append(("frame_errors", f"{new['frame_errors']} frame errors"))
    if new["actions_non_finite"]:
        problems.append(("actions_non_finite", f"{new['actions_non_finite']} chunks with non-finite actions dropped"))
    if new["recompiles"]:
        problems.append(("recompiles", f"{new['recompiles']} graphs compiled after warm-up (a shape outside the "
                                       "buckets)"))
    if d["k"] < d["k_max"]:
        problems.append(("k", f"language budget k={d['k']} of {d['k_max']} (frames near the "
                              f"{d['frame_deadline_ms']:.0f} ms deadline)"))
    f = d["action_frequency_hz"]
    if not math.isnan(f) and f < d["control_rate_hz"]:
        problems.append(("action_frequency", f"action frequency {f:.0f} Hz below the control rate"))
    return problems


def _overload(d: dict) -> str:
    """Why chunks ran out, when the reason is the frames' pace: the frame worker ran frames
    (nearly) back to back, so observations waited for it ("" otherwise)."""
    load = d.get("worker_load", 0.0)
    if not load >= OVERLOADED:
        return ""
    remedy = "fewer robots or a lower camera rate" if d.get("compiled", True) else (
        "compile:=on, fewer robots or a lower camera rate")
    return (f" (the frame worker ran frames {load:.0%} of the time, {d['frame_latency_ms']:.1f} ms each: "
            f"observations wait for it; {remedy})")


def _late_observations(d: dict) -> str:
    """Why chunks ran out, when the reason is the delay from capture to action: a chunk first goes out
    so long after its observation's stamp that the rows left (the rows due meanwhile are skipped:
    chunk_origin observation) last less than the time to the next observation ("" otherwise)."""
    delay, interval = d.get("capture_to_action_ms", float("nan")), d.get("observation_interval_ms", float("nan"))
    span = d["horizon"] * 1e3 / d["control_rate_hz"]
    if d.get("chunk_origin") != "observation" or not (0 <= delay < span and span - delay < interval):
        return ""  # (with frame_end no row is skipped: every chunk lasts its whole span)
    return (f" (late observations: each chunk first goes out {delay:.0f} ms after its observation's stamp, "
            f"so its rows for that time are skipped and the rest last {span - delay:.0f} ms of its {span:.0f}, "
            f"against {interval:.0f} ms between observations; a camera side or network that delivers late, or "
            "a slow frame: see the frame time; chunk_origin: frame_end keeps every row, uncompensated)")


class StatusReporter:
    """(level, message) of each status: ERROR when the action output is stopped, WARN
    for what happened since the last status (underruns, stale observations, holds,
    frame errors, a shrunken language budget, ...), else OK; and the console lines
    among them (:meth:`console`). ``observation_topic``: the resolved name, for the
    line that says none has arrived."""

    def __init__(self, observation_topic: str = "", clock=time.monotonic) -> None:
        self._previous = {key: 0 for key in NEW_SINCE_LAST}
        self._problems: list[tuple[str, str]] = []
        self._observation_topic = observation_topic
        self._clock = clock
        self._started = clock()
        self._throttle = Throttle(CONSOLE_PERIOD_S, clock)
        self._underruns = 0  # those of the last status
        self._underruns_held = 0  # those of the seconds held back since the last underrun line

    def restart(self, d: dict) -> None:
        """Count from the figures ``d`` on, as at a start (an activate after a deactivate):
        what happened before is not news, and a missing observation gets its grace again."""
        self._previous = {key: d[key] for key in NEW_SINCE_LAST}
        self._problems = []
        self._started = self._clock()

    def status(self, d: dict, max_observation_age: float) -> tuple:
        new = {key: d[key] - self._previous.get(key, 0) for key in NEW_SINCE_LAST}
        self._previous = {key: d[key] for key in NEW_SINCE_LAST}
        self._problems = problems = _problems(d, new, max_observation_age)
        self._underruns = new["underruns"]
        if any(kind in ERRORS for kind, _ in problems):
            level = DiagnosticStatus.ERROR
        else:
            level = DiagnosticStatus.WARN if problems else DiagnosticStatus.OK
        message = "; ".join(text for _, text in problems) if problems else (
            f"ticks {d['control_rate_hz']:g} Hz, f=H/T {d['action_frequency_hz']:.0f} Hz, frame "
            f"{d['frame_latency_ms']:.1f} ms, "
            f"{d['tokens_per_s']:.0f} tok/s")
        return level, message

    def console(self, kinds=CONSOLE) -> list[str]:
        """The warnings to print now for the last :meth:`status`: its problems of the ``kinds``
        (default :data:`CONSOLE`), each kind at most every :data:`CONSOLE_PERIOD_S` s (with how
        many were held back), and none about a missing observation in the first
        :data:`NO_OBSERVATION_WARN_S` s."""
        lines = []
        elapsed = self._clock() - self._started
        for kind, text in self._problems:
            if kind not in kinds or (kind == "no_observation" and elapsed < NO_OBSERVATION_WARN_S):
                continue
            if kind == "no_observation":
                text = (f"no observation on {self._observation_topic or 'the observation topic'} "
                        f"{elapsed:.0f} s after start (is the camera node running, on these topics?)")
            elif kind == "underruns":  # "N underruns[ (cause)]"
                text = text.replace(" underruns", " underruns in the last second: the chunk ran out before "
                                    "the next one", 1) + " (see /diagnostics)"
            suppressed = self._throttle(kind)
            if kind == "underruns" and suppressed is None:
                self._underruns_held += self._underruns
            elif suppressed is not None:
                lines.append(text + self._held_back(kind, suppressed))
        if "underruns" in kinds and self._underruns_held and "underruns" not in dict(self._problems) \
                and self._throttle.due("underruns"):  # said within the period, not at the next underrun
            seconds, held = self._throttle("underruns"), self._underruns_held
            self._underruns_held = 0
            lines.append(f"{held} more underruns in {seconds} second(s) since the last report (see /diagnostics)")
        return lines

    def _held_back(self, kind: str, suppressed: int) -> str:
        """What a console line adds of the ``suppressed`` seconds of ``kind`` held back since its last."""
        if not suppressed:
            return ""
        held, self._underruns_held = (self._underruns_held, 0) if kind == "underruns" else (0, self._underruns_held)
        return f" ({suppressed} more such seconds since the last report{f', {held} underruns in them' if held else ''})"


def diagnostic_figures(age_ns: int | None, ticks: dict, loop: dict, *, worker: Any, engine: Any, tokens_per_s: float,
                       counters: dict, params: dict, horizon: int, tick_lateness_ms: Any) -> dict:
    """The figures published on /diagnostics, in their published order: ``age_ns`` (of the newest chunk),
    ``ticks`` (underruns, ticks, ticks_waiting) and ``loop`` (the frame loop's figures) as read under the
    node's lock; the frame worker, the engine, the token rate, the counters and the parameter values."""
    frame_ms, pool, c = worker.frame_ms, engine.pool, counters
    return {
        "action_frequency_hz": action_frequency(horizon, frame_ms.mean() / 1e3),
        "frame_latency_ms": frame_ms.mean(), "frame_latency_p99_ms": frame_ms.percentile(99),
        "chunk_age_ms": float("nan") if age_ns is None else age_ns / 1e6,
        **ticks, "missed_ticks": c["missed_ticks"],
        "tick_lateness_p99_ms": percentile(tick_lateness_ms.values()[-500:], 99),
        "active_batch": len(engine.requests.active), "queued_requests": len(engine.requests.queue),
        "decode_batch_mean": worker.last_batch, "worker_load": worker.load_fraction(),
        "frame_running_s": worker.frame_running_s(),
        "tokens_per_s": tokens_per_s,
        "kv_bytes_reserved": pool.bytes_reserved, "kv_bytes_in_use": pool.bytes_in_use,
        "setting": params["setting"], "compiled": engine.compiled is not None, "recompiles": engine.recompiles,
        **{key: loop[key] for key in ("k", "k_max", "frame_deadline_ms")},
        "control_rate_hz": params["control_rate_hz"], "horizon": horizon,
        "hold_action": params["hold_action"], "hold_ticks": c["hold_ticks"], "chunk_origin": params["chunk_origin"],
        **{key: loop[key] for key in ("observation_age_ms", "faulted", "consecutive_failures", "last_failure")},
        **{key: c[key] for key in COUNTED[:11]},
        # every kind the question intake counts (questions_rejected_<why>)
        "questions_rejected": sum(n for key, n in c.items() if key.startswith("questions_rejected_")),
        **{key: c[key] for key in COUNTED[11:]},
    }

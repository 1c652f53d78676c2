"""The figures of ``oxygen-agent --report``: what a run measured, and where.

:class:`Measurement` keeps the measurement window (the first ActionChunk the
inference node published .. :meth:`Measurement.freeze`, before the shutdown;
after a lifecycle cleanup and configure, which start the node's counts again, from
the first chunk of that configuration) with the node's counts at both ends; :meth:`Measurement.report` turns it into
the JSON fields below (``None`` where nothing was measured):

* ``duration_s`` - the measurement window's length (None: no window, no chunk was published); ``control_rate_hz``,
  ``setting``, ``k`` (``steps_per_frame``), ``horizon`` (H) and ``model`` (where
  it came from) - what ran;
* ``frames`` - observation frames the node ran in the window;
  ``frame_latency_mean_ms`` / ``frame_latency_p99_ms`` and
  ``action_frequency_hz`` - the node's own ``/diagnostics`` figures at the end
  of the window (frame latency over its recent frames; ``f = H / T`` with T
  that frame latency, what the node could serve, not the chunks published:
  with several robots each robot's ``action_frequency_hz`` is H x its chunks
  per second, see :mod:`.agent_robots_report`);
* ``observations_received`` and ``text_tokens_published_total`` - the node's
  counts since its start (not the window's);
* ``load_average`` - the machine's 1, 5 and 15 minute load averages at the end
  (other work on the machine shows in every timing);
* ``start_to_first_chunk_s`` - from the start of the ``oxygen-agent`` process
  to the first ActionChunk the inference node published (model loading,
  compiling with ``compile:=on``, warm-up, the first frame); added by the agent;
* ``tick_rate_hz`` - node side: control ticks counted by the inference node
  over the measurement window / the seconds the node was active in it
  (``active_s``: a lifecycle node deactivated for a while, or shutting down at
  the end, has no ticks to count then);
* ``control_rate_changed_hz`` - ``[at the window's start, at its end]`` when
  ``control_rate_hz`` was changed during the window, also when it was set back
  to where it started (``[50.0, 50.0]``); None otherwise (the top
  ``control_rate_hz`` is the end's). The tick jitter figures are then None:
  there is no one control period to measure them against;
* ``tick_jitter_p50_ms`` / ``tick_jitter_p99_ms`` - subscriber side:
  ``|inter-arrival - control period|`` of consecutive ``ActionChunk`` messages
  on ``actions_topic`` as received by a subscriber in a process of its own
  (:mod:`.arrival_probe`, what a controller sees: the node's tick latency plus
  DDS delivery; ``measured_by`` says so). Only if the probe cannot start does
  the agent process subscribe to the actions and observations and measure them
  itself (``measured_by: agent process``; its threads share the interpreter
  lock with the inference worker, so it sees more jitter); without
  ``--report`` nothing subscribes to them there. ``tick_lateness_*_ms`` is the
  node-side part alone (timer callback start - scheduled time);
* ``probe_priority`` - the arrival probe's ``SCHED_FIFO`` priority (``--probe-priority``;
  0: it ran at normal priority; None: no probe), added by the agent;
* ``underruns`` - node side: ticks with no action left in the window;
  ``missed_ticks``: ticks rcl skipped because the timer callback was more
  than a period late (they count neither as ticks nor as underruns);
* ``obs_to_action_p50_ms`` / ``_p99_ms`` - subscriber side, in the probe's
  process too: arrival of an ``Observation`` -> arrival of the first
  ``ActionChunk`` computed from it (matched by ``observation_seq``);
* ``ros_overhead_p99_ms`` (and ``_p50_ms``) - what ROS adds: that latency
  minus, for the same frame (read from the node in the agent process), the
  engine's frame time (``Engine.step``'s wall time, which includes the time the
  frame stepped aside for control ticks, reported as ``paused_*_ms``;
  ``ros_overhead_with_pauses_*_ms`` counts them as ROS's), the wait for the worker
  (``queue_wait``: a frame was still running when the observation came) and
  the wait for the control tick that first publishes the chunk
  (``tick_wait``: actions go out on the tick grid, one period at most, plus
  that tick's own lateness). What
  is left is DDS delivery both ways, the callbacks' scheduling and the message
  conversions (``conversion_*_ms``, the part inside the node). The three
  parts are reported too (``queue_wait_*``, ``tick_wait_*``, ``conversion_*``,
  ``paused_*``, p50/p99 over the frames in the window), so that
  ``obs_to_action = ros_overhead + queue_wait + engine + tick_wait`` per frame;
* ``actions_published`` / ``text_tokens_published`` - node-side counts in the
  window (``actions_published``: control ticks that published, the sum of the
  robots' figures with several; ``text_tokens_published``: TextToken messages,
  the ends that carry no token included, as the monitor counts what it receives); ``actions_received`` is the measuring subscriber's count in the
  window (None when nothing measured: no probe and several robots, or the probe's record lost),
  ``text_tokens_received`` the agent's monitor's over the whole run, from its start to after the
  shutdown's cancellations (it prints the text), so it may exceed ``text_tokens_published``;
  with no window (no chunk ever published) the tick lateness percentiles are None;
* ``robots`` - with an inference node serving several robots, the figures of
  each (:mod:`.agent_robots_report`, which also says what the top-level
  figures then cover); absent with one robot;
* ``camera_side_restarts`` - with ``respawn:=true``, how many times each
  robot's camera side (``""``: the one camera side without robots) was
  restarted over the whole run, added by the agent; None without.
"""

from __future__ import annotations

import math
import os
import threading
import time
from typing import Any

from ..core.stats import percentile
from .agent_robots_report import (
    active_seconds,
    in_window,
    jitter_ms,
    pooled,
    robot_diagnostics,
    robot_names,
    robot_ticks,
    robots_section,
    total_ticks,
)

PARTS = ("queue_wait", "tick_wait", "conversion", "paused")


class Measurement:
    """The measurement window of one run of the inference node ``inference``, and, with
    ``measure`` (a report whose arrival probe could not start), the ActionChunk and
    Observation arrivals in this process (:meth:`on_actions`, :meth:`on_observation`)."""

    def __init__(self, inference, measure: bool = False):
        self.inference, self.measure = inference, measure
        self.robots = robot_names(inference)
        self.lock = threading.Lock()
        self.actions: list[tuple[float, int, int]] = []  # (arrival, frame_id, observation_seq)
        self.obs_arrival: dict[int, float] = {}
        self.latencies: list[tuple[int, int, float]] = []  # (frame_id, seq, obs->action ms)
        self.seen_frames: set[int] = set()
        self.start: dict[str, Any] | None = None
        self.end: dict[str, Any] | None = None
        #: when the first ActionChunk of the run came (monotonic s): a cleanup and a
        #: configure restart the window, not this
        self.first_chunk: float | None = None

    def poll(self) -> None:
        """Start the window at the first ActionChunk the node published (called by the
        agent's main loop; with ``measure``, the first one received starts it)."""
        node = self.inference
        if self.start is not None and self.start["configuration"] != getattr(node, "configurations", 1):
            self.start = None  # a cleanup and a configure: new counters, the window restarts in them
        if self.start is None and node.configured and total_ticks(node, self.robots)["published"] > 0:
            with self.lock:
                self._start_window(time.monotonic())

    def _start_window(self, t: float) -> None:
        if self.first_chunk is None:
            self.first_chunk = t
        if self.start is None:
            node = self.inference
            per_robot = robot_ticks(node, self.robots)
            ticks = total_ticks(node, self.robots, per_robot)
            self.start = {"t": t, "t_ns": time.monotonic_ns(), "ticks": ticks["ticks"],
                          "active_s": node.ticking.seconds(), "configuration": getattr(node, "configurations", 1),
                          "control_rate_hz": node.params["control_rate_hz"],
                          "underruns": ticks["underruns"], "published": ticks["published"], "counters": dict(node.counters),
                          "lateness_total": node.tick_lateness_ms.total, "robot_ticks": per_robot}

    def on_observation(self, msg) -> None:
        with self.lock:
            self.obs_arrival[int(msg.seq)] = time.monotonic()

    def on_actions(self, msg) -> None:
        t = time.monotonic()
        with self.lock:
            self._start_window(t)
            self.actions.append((t, int(msg.frame_id), int(msg.observation_seq)))
            if msg.frame_id not in self.seen_frames:
                self.seen_frames.add(int(msg.frame_id))
                t_obs = self.obs_arrival.pop(int(msg.observation_seq), None)
                if t_obs is not None:
                    self.latencies.append((int(msg.frame_id), int(msg.observation_seq), (t - t_obs) * 1e3))

    def freeze(self) -> None:
        """End the window: keep the node's counts as they are now (none, with no report to
        come, when the node is not configured now: a lifecycle node never configured, or
        cleaned up)."""
        node = self.inference
        if not node.configured:
            return
        with self.lock:
            per_robot = robot_ticks(node, self.robots)  # one snapshot: the totals are its sums
            self.end = {"t": time.monotonic(), "ticks": total_ticks(node, self.robots, per_robot),
                        "active_s": node.ticking.seconds(),
                        "counters": dict(node.counters), "lateness": node.tick_lateness_ms.values(),
                        "robot_ticks": per_robot, "control_rate_hz": node.params["control_rate_hz"],
                        "robot_diag": robot_diagnostics(node, self.robots),
                        "lateness_total": node.tick_lateness_ms.total, "actions": len(self.actions)}

    def report(self, probed: dict[str, Any] | None = None, text_received: int = 0) -> dict[str, Any] | None:
        """The figures described in the module doc. ``probed``: what :mod:`.arrival_probe`
        recorded in its own process, by robot ("" for one robot); ``text_received``:
        TextTokens the agent received. None when the node is not configured at the end."""
        if self.end is None:
            self.freeze()
        if self.end is None:
            return None
        with self.lock:
            end, start = self.end, self.start
            arrivals = [t for t, _, _ in self.actions[:end["actions"]]]
            latencies = [("", *x) for x in self.latencies]  # (robot, frame, seq, ms)
        rate = start["control_rate_hz"] if start is not None else end["control_rate_hz"]
        changed = rate != end["control_rate_hz"] or window_count(start, end, "control_rate_changes") > 0
        period_s = None if changed else 1.0 / rate  # no one period to measure jitter against
        jitter = jitter_ms(period_s, arrivals)
        measured_by = "agent process" if self.measure and not self.robots else None
        received = len(arrivals) if measured_by else None  # None: nothing here received them
        if probed is not None and start is not None:
            if self.robots:
                jitter, latencies, received = pooled(period_s, probed, self.robots, start["t"], end["t"])
            else:
                arrivals, lat = in_window(probed.get(""), start["t"], end["t"])
                jitter, received, latencies = jitter_ms(period_s, arrivals), len(arrivals), [("", *x) for x in lat]
            measured_by = "arrival_probe (own process)"
        node = self.inference
        out = {**_run(node, start, end, max(1, len(self.robots))), **_timing(jitter, start, end),
               "measured_by": measured_by, **_latency(self._records(), latencies, start), **_counts(node, start, end),
               "actions_received": received, "text_tokens_received": text_received,
               "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
               "control_rate_changed_hz": [rate, end["control_rate_hz"]] if changed else None}
        if self.robots:
            out["robots"] = robots_section(self.robots, period_s, probed, start, end)
        return out

    def _records(self) -> dict:
        """The node's recent frame records of every robot, by (robot, frame id): a frame that
        served several robots has a record for each ("" for the only robot)."""
        if not self.robots:
            return {("", f): r for f, r in self.inference.frame_records().items()}
        return {(robot, f): r for robot in self.robots for f, r in self.inference.frame_records(robot).items()}


def _run(node, start, end, robots: int = 1) -> dict[str, Any]:
    """What ran, and for how long (``tick_rate_hz``: per robot, of ``robots``)."""
    window = (end["t"] - start["t"]) if start else 0.0
    active = active_seconds(start, end)
    ticks = (end["ticks"]["ticks"] - (start["ticks"] if start else 0)) / robots
    return {
        "duration_s": round(window, 3) if start else None,  # no window: no chunk was ever published
        "active_s": round(active, 3) if start else None,
        "control_rate_hz": node.params["control_rate_hz"],
        "setting": node.params["setting"],
        "k": node.params["steps_per_frame"],
        "horizon": node.horizon,
        "model": node.loaded.source,
        "tick_rate_hz": round(ticks / active, 3) if active > 0 else None,
        # compiled or eager, and why eager (compile:=on that fell back to eager looks like any other run)
        "compiled": node.engine.compiled is not None,
        "compile_reason": node.engine.compile_reason,
        "recompiles": node.engine.recompiles,
    }


def _timing(jitter: list[float], start, end) -> dict[str, Any]:
    """Tick jitter (subscriber side, ms) and tick lateness (node side) in the window."""
    lateness = []  # no window (no chunk ever published): no figure, rather than the whole run's
    if start is not None:
        new_lateness = end["lateness_total"] - start["lateness_total"]
        lateness = end["lateness"][-new_lateness:] if new_lateness > 0 else []
    return {"tick_jitter_p50_ms": _pct(jitter, 50), "tick_jitter_p99_ms": _pct(jitter, 99),
            "tick_lateness_p50_ms": _pct(lateness, 50), "tick_lateness_p99_ms": _pct(lateness, 99)}


def _latency(records: dict, latencies: list[tuple[str, int, int, float]], start) -> dict[str, Any]:
    """Observation -> first action, what ROS adds to it, and its parts inside the node
    (``records`` by (robot, frame id), ``latencies`` as (robot, frame id, seq, ms): each
    robot's latency against its own record of the frame)."""
    parts = {(robot, f): latency_parts(r) for robot, f, _, _ in latencies
             if (r := records.get((robot, f))) is not None and r.first_published_ns is not None}
    # subscriber-side latency minus what is not ROS: the engine's frame, the wait for the
    # worker (a frame already running) and the wait for the control tick that publishes it
    per_frame = [(lat - p["engine"] - p["queue_wait"] - p["tick_wait"], p["paused"])
                 for robot, f, _, lat in latencies if (p := parts.get((robot, f))) is not None]
    overhead = [x for x, _ in per_frame]
    with_pauses = [x + paused for x, paused in per_frame]
    in_window = [latency_parts(r) for r in records.values()
                 if r.first_published_ns is not None and (start is None or r.received_ns >= start["t_ns"])]
    return {
        "obs_to_action_p50_ms": _pct([x for *_, x in latencies], 50),
        "obs_to_action_p99_ms": _pct([x for *_, x in latencies], 99),
        "ros_overhead_p50_ms": _pct(overhead, 50),
        "ros_overhead_p99_ms": _pct(overhead, 99),
        "ros_overhead_with_pauses_p50_ms": _pct(with_pauses, 50),
        "ros_overhead_with_pauses_p99_ms": _pct(with_pauses, 99),
        **{f"{name}_p{q}_ms": _pct([x[name] for x in in_window], q) for name in PARTS for q in (50, 99)},
    }


def window_count(start, end, name: str) -> int:
    """How much the node's counter ``name`` grew over the window (since the node's start with no window)."""
    return end["counters"].get(name, 0) - (start["counters"].get(name, 0) if start else 0)


def _counts(node, start, end) -> dict[str, Any]:
    """The node's own figures, and its counts over the window."""
    counters = end["counters"]

    def count(name: str) -> int:
        return window_count(start, end, name)

    d = node.diagnostics()
    return {
        "underruns": end["ticks"]["underruns"] - (start["underruns"] if start else 0),
        "missed_ticks": count("missed_ticks"),
        "frame_latency_mean_ms": _round(d["frame_latency_ms"]),
        "frame_latency_p99_ms": _round(d["frame_latency_p99_ms"]),
        "action_frequency_hz": _round(d["action_frequency_hz"]),
        "frames": count("frames"),
        # the control ticks that published, as each robot's figure counts them (their sum)
        "actions_published": end["ticks"]["published"] - (start["published"] if start else 0),
        "text_tokens_published": count("text_tokens_published"),
        "text_tokens_published_total": node.counters.get("text_tokens_published", 0),
        "observations_received": counters.get("observations_received", 0),
    }


def latency_parts(r) -> dict[str, float]:
    """Where one frame's observation-to-first-action time went inside the inference
    node (ms): ``queue_wait`` (callback -> the worker takes it: a frame was running),
    ``conversion`` (message -> model input, and the engine's result -> chunk),
    ``engine`` (``Engine.step``'s wall time; ``paused`` is the part of it spent
    stepping aside for control ticks, ``yield_to_ticks``), ``tick_wait`` (frame
    end -> the control tick that first publishes its chunk)."""
    total = (r.finished_ns - r.dequeued_ns) / 1e6
    return {"queue_wait": (r.dequeued_ns - r.received_ns) / 1e6, "engine": r.engine_ms,
            "paused": r.paused_ms, "conversion": total - r.engine_ms,
            "tick_wait": (r.first_published_ns - r.finished_ns) / 1e6}


def _pct(values, q):
    v = percentile(values, q)
    return None if math.isnan(v) else round(v, 3)


def _round(v):
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(v, 3)

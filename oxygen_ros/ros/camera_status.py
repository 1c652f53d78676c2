"""The camera node's counters, figures and status: what it published on /diagnostics and the console.

:class:`CameraStatus` counts what the camera node received, refused, grouped and
dropped, measures each camera's received rate over the last :data:`RATE_WINDOW_S`
seconds, and turns them into the ``/diagnostics`` figures, the status (level and
message) and the throttled console warnings: a camera below ``min_camera_rate_hz``
(including one that never delivered), a camera missing frames by its stamps
(:data:`MISSING_SHARE`), rejected images and stale groups are logged where they happen.

A frame is missing when its camera's stamps step a whole number of periods (2 to
:data:`MISSING_MAX_STEPS`, within a quarter period) between two frames received:
best effort loses large raw images whole when one fragment is lost (a 640x480
``rgb8`` camera at 30 Hz lost every other frame here), which a rate above
``min_camera_rate_hz`` does not show, and the chunks then come late (underruns).
Such a step is counted once the next step is not the same again (a camera whose
rate was lowered steps by one multiple of its old period, frame after frame,
until its period is learnt anew, and lost none) and is not a catch-up, shorter
than half a period (a frame published late, the next on time: none lost). The
period the node passes is its grouping's jitter-robust one
(:func:`oxygen_ros.core.grouping.typical_period_ns`): one taken from the
shortest stamp step counted 14-15 of 900 frames missing at 5 ms of jitter
where none was.
A lockstep bag player's held images step by a hold, not by whole periods. Frames
missing while the node settles (:meth:`CameraStatus.settling`) are counted but
not warned about: a publisher starting beside busy processes skips frames (the
demo's camera did).

After a stall of the node's own process (:data:`STALL_READINGS`) the rates start
again instead of reading the stall as a slow camera.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any, Callable

from diagnostic_msgs.msg import DiagnosticStatus

from oxygen_ros.core.throttle import Throttle
from oxygen_ros.ros.qos import NO_PUBLISHER_CHECKS, image_qos_hint

#: Seconds over which a camera's received rate is measured (and the grace after start).
RATE_WINDOW_S = 3.0
#: Why no state comes when its topic has no publisher.
NO_PUBLISHER = f"nothing publishes on it: check its name {NO_PUBLISHER_CHECKS}"
#: Why a camera that delivered, and whose publisher is still there, sends nothing.
SILENT_PUBLISHER = ("its publisher is still listed but sends nothing (a driver that stopped or hung, or one killed: "
                    "DDS forgets a killed process's publisher only after a while), and no observation goes out until "
                    "it sends")
#: Seconds between two console warnings about one camera's rate.
RATE_WARN_PERIOD_S = 5.0
#: A gap of this many reading periods between two readings of the rates (1.5 s: the camera node
#: reads them every second, so a reading half a second late) means this process took no messages
#: for a while: another node of the same process was busy (``oxygen-agent`` runs the inference
#: node's start, 1.6 s with a warm compile cache and a minute compiling at a cold one, in the
#: camera's process). The rates then start again from that reading, with their grace. A shorter
#: stall costs a 10 Hz camera at most 10 frames of a window, 5 of them queued: still above 5 Hz.
STALL_READINGS = 1.5
#: The share of a camera's frames over the last RATE_WINDOW_S seconds missing by its stamps (and at least
#: 3 of them) from which the console warns.
MISSING_SHARE = 0.1
#: The longest stamp step, in periods, read as frames missing (longer: the camera paused).
MISSING_MAX_STEPS = 10


class RateWindow:
    """Events per second over the last ``window`` seconds (since ``start`` while shorter)."""

    def __init__(self, start: float, window: float = RATE_WINDOW_S):
        self.start, self.window = start, window
        self._times: deque[float] = deque()

    def restart(self, now: float) -> None:
        """Measure from ``now`` on, as if just started."""
        self.start = now
        self._times.clear()

    def add(self, now: float) -> None:
        self._times.append(now)
        self._drop(now)

    def _drop(self, now: float) -> None:
        while self._times and self._times[0] < now - self.window:
            self._times.popleft()

    def rate(self, now: float) -> float:
        """The rate (NaN in the first ``window`` seconds after ``start``: too short to tell)."""
        self._drop(now)
        span = now - self.start
        return math.nan if span < self.window else len(self._times) / self.window


def stale_group_text(max_age: float, frames: list[tuple[str, int, int]]) -> str:
    """The warning for a group dropped as stale; ``frames``: (topic, age by its stamp, time since
    it arrived) of each stale camera's frame, in ns. When each arrived within ``max_age``, it was
    stale on arrival: its stamp is behind, by a camera clock behind this machine's or by transit."""
    text = f"dropped a stale group (max_age {max_age} s): " + ", ".join(
        f"{topic} {age / 1e9:.3f} s" for topic, age, _ in frames)
    if frames and all(held <= max_age * 1e9 for _, _, held in frames):
        behind = min(age - held for _, age, held in frames)
        text += (f"; stale on arrival, stamped {behind / 1e9:.3f} s before they arrived (a camera "
                 "clock behind this machine's: sync them, chrony or PTP; or that long in transit)")
    return text


class CameraStatus:
    """Counters and per-camera figures of a camera node with cameras ``names`` on ``topics``
    (resolved names); ``reasons``: every rejection reason counted; ``reading_period``: seconds
    between the node's readings of the rates (its diagnostics)."""

    def __init__(self, names: list[str], topics: list[str], reasons: tuple[str, ...],
                 clock: Callable[[], float] = time.monotonic, reading_period: float = 1.0):
        self.names, self.topics, self._clock = names, topics, clock
        self._stall_s = STALL_READINGS * reading_period
        start = clock()
        self.rejected: dict[str, int] = {r: 0 for r in reasons}
        self.published = self.dropped_stale = self.waiting_for_state = self.waiting_for_instruction = 0
        self.state_problem = "no valid state"  # why the last group waiting for a state did (the node says)
        self.received = [0] * len(topics)  # good frames per camera
        self.missing = [0] * len(topics)  # frames missing by the stamps, per camera (see the module doc)
        self._stamps: list[int | None] = [None] * len(topics)  # each camera's last frame's stamp
        self._missed = [RateWindow(start) for _ in topics]
        # per camera, the last step of whole periods: (step, period, frames missing), counted once
        # the next step differs from it (the same step again: the camera's rate changed)
        self._gaps: list[tuple[int, int, int] | None] = [None] * len(topics)
        self._spread_ns: int | None = None  # the widest stamp spread of a group published since the last figures
        self._last_frame: list[float | None] = [None] * len(topics)
        self._rates = [RateWindow(start) for _ in topics]
        self._last_reading = start  # of the rates (see STALL_READINGS)
        self._since = start  # the node's start, or the end of its process's last stall
        self._previous: dict[str, int] = {}
        self._throttle = Throttle(RATE_WARN_PERIOD_S, clock)

    def settling(self) -> bool:
        """Whether the node started, its first frame came, a camera came back after a silence
        longer than :data:`RATE_WINDOW_S` (its driver restarted: the silence was warned of while
        it lasted), or its process stalled, less than :data:`RATE_WINDOW_S` ago: publishers come
        up in any order (a bag player started after the node sends its first images before their
        state), so a state missing then is expected, not a fault."""
        return self._clock() - self._since < RATE_WINDOW_S

    def frame(self, index: int, stamp_ns: int | None = None, period_ns: int | None = None) -> None:
        """Camera ``index`` delivered a good frame stamped ``stamp_ns``; ``period_ns``: the camera's
        period as its stamps showed it before this frame (None: not known yet)."""
        now = self._clock()
        last = self._last_frame[index]
        back = last is not None and now - last > RATE_WINDOW_S  # after a silence: a restarted driver
        if not any(self.received) or back:  # the first frame: its publishers are coming up now
            self._since = now
        if not self.received[index] or back:  # its rate from its first frame on: not the silence before it
            self._rates[index].restart(now)
        self.received[index] += 1
        self._last_frame[index] = now
        self._rates[index].add(now)
        previous, self._stamps[index] = self._stamps[index], stamp_ns
        if previous is None or stamp_ns is None or not period_ns:
            return
        step = stamp_ns - previous
        gap, self._gaps[index] = self._gaps[index], None
        # frames were lost unless the step after the gap is the same again (the camera's new rate) or
        # a catch-up, under half the gap's period (a frame published late, then the next on time)
        if gap is not None and 4 * abs(step - gap[0]) >= gap[1] and 2 * step >= gap[1]:
            self.missing[index] += gap[2]
            for _ in range(0 if self.settling() else gap[2]):  # (publishers starting skip frames)
                self._missed[index].add(now)
        steps = round(step / period_ns)
        if 2 <= steps <= MISSING_MAX_STEPS and 4 * abs(step - steps * period_ns) < period_ns:
            self._gaps[index] = (step, period_ns, steps - 1)

    def silent_for(self, index: int) -> float | None:
        """Seconds since camera ``index``'s last frame (None: none came yet)."""
        last = self._last_frame[index]
        return None if last is None else self._clock() - last

    def group(self, spread_ns: int) -> None:
        """A group went out, its frames' stamps ``spread_ns`` apart (newest minus oldest)."""
        self.published += 1
        self._spread_ns = spread_ns if self._spread_ns is None else max(self._spread_ns, spread_ns)

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def rates(self) -> list[float]:
        """Each camera's received rate (NaN while too short to tell: after start and after a stall,
        see :data:`STALL_READINGS`, when the frames that did not arrive were never taken, not lost)."""
        now = self._clock()
        if now - self._last_reading > self._stall_s:
            self._since = now
            for r in self._rates + self._missed:
                r.restart(now)
        self._last_reading = now
        return [r.rate(now) for r in self._rates]

    def figures(self, instruction: str) -> dict[str, Any]:
        """The figures published on /diagnostics."""
        now = self._clock()
        out: dict[str, Any] = {f"rejected_{reason}": count for reason, count in self.rejected.items()}
        out.update(rejected_total=sum(self.rejected.values()), published=self.published,
                   dropped_stale=self.dropped_stale, waiting_for_state=self.waiting_for_state,
                   waiting_for_instruction=self.waiting_for_instruction, instruction=instruction,
                   group_stamp_spread_ms=math.nan if self._spread_ns is None else self._spread_ns / 1e6)
        self._spread_ns = None
        for name, topic, count, missing, last, rate in zip(self.names, self.topics, self.received, self.missing,
                                                           self._last_frame, self.rates()):
            out[f"{name}.topic"] = topic
            out[f"{name}.frames"] = count
            out[f"{name}.frames_missing"] = missing
            out[f"{name}.rate_hz"] = rate
            out[f"{name}.last_frame_age_s"] = math.nan if last is None else now - last
        return out

    def status(self, d: dict[str, Any], max_age: float, min_rate_hz: float) -> tuple[bytes, str]:
        """(level, message): WARN for rejections, stale groups and groups held for want of a state
        since the last status, for cameras silent for longer than ``max_age`` and for cameras below
        ``min_rate_hz``; else OK."""
        problems = []
        new = {reason: count - self._previous.get(reason, 0) for reason, count in self.rejected.items()}
        self._previous.update(self.rejected)
        rejected = ", ".join(f"{n} {reason}" for reason, n in new.items() if n)
        if rejected:
            problems.append(f"rejected: {rejected}")
        stale = self.dropped_stale - self._previous.get("_stale", 0)
        self._previous["_stale"] = self.dropped_stale
        if stale:
            problems.append(f"{stale} stale groups dropped")
        held = self.waiting_for_state - self._previous.get("_no_state", 0)
        self._previous["_no_state"] = self.waiting_for_state
        if held and not self.settling():  # at the start the state's publisher may come up after the cameras'
            problems.append(f"{held} groups not published: {self.state_problem}")
        silent = [f"{name} ({d[f'{name}.last_frame_age_s']:.1f} s)" if self.received[i] else f"{name} (no frame yet)"
                  for i, name in enumerate(self.names)
                  if not self.received[i] or d[f"{name}.last_frame_age_s"] > max_age]
        if silent:
            problems.append("no frame from " + ", ".join(silent))
        slow = [f"{name} {d[f'{name}.rate_hz']:.1f} Hz" for name in self.names if _below(d[f"{name}.rate_hz"],
                                                                                         min_rate_hz)]
        if slow:
            problems.append(f"below min_camera_rate_hz {min_rate_hz:g}: " + ", ".join(slow))
        level = DiagnosticStatus.WARN if problems else DiagnosticStatus.OK
        return level, "; ".join(problems) if problems else f"{self.published} observations published"

    def rate_warnings(self, min_rate_hz: float, hint: Callable[[int], str] = lambda index: "") -> list[str]:
        """Console lines for the cameras below ``min_rate_hz`` now, each camera at most every
        :data:`RATE_WARN_PERIOD_S` s; ``hint(index)``: what may help, appended to the line."""
        lines = []
        for index, rate in enumerate(self.rates()):
            if not _below(rate, min_rate_hz):
                continue
            suppressed = self._throttle(index)
            if suppressed is None:
                continue
            line = (f"camera {self.names[index]} on {self.topics[index]}: {rate:.1f} frames/s received over the "
                    f"last {RATE_WINDOW_S:g} s, below min_camera_rate_hz {min_rate_hz:g}")
            rejected = sum(self.rejected.values())
            if rejected:
                line += f" ({rejected} images rejected so far, see the warnings above)"
            lines.append(line + hint(index))
        return lines + self._missing_warnings(hint)

    def _missing_warnings(self, hint: Callable[[int], str]) -> list[str]:
        """Console lines for the cameras missing over :data:`MISSING_SHARE` of their frames now."""
        lines, now = [], self._clock()
        for index, (missed, received) in enumerate(zip(self._missed, self._rates)):
            lost, got = missed.rate(now) * RATE_WINDOW_S, received.rate(now) * RATE_WINDOW_S
            if not lost >= max(3, MISSING_SHARE * (lost + got)):  # (NaN while too short to tell)
                continue
            suppressed = self._throttle(("missing", index))
            if suppressed is not None:
                lines.append(f"camera {self.names[index]} on {self.topics[index]}: {lost:.0f} frames missing by "
                             f"their stamps over the last {RATE_WINDOW_S:g} s, {got:.0f} received: lost on the "
                             f"way or never sent; the chunks then come late" + hint(index))
        return lines


def _below(rate: float, minimum: float) -> bool:
    return minimum > 0 and not math.isnan(rate) and rate < minimum


def publishers_hint(topic: str, infos: list, subscription, image_bytes: int | None, silent_s: float | None,
                    received: int) -> str:
    """What may help a camera on ``topic`` that is slow or misses frames, from its publishers
    (``infos``: rclpy's TopicEndpointInfo): for one that delivered ``received`` frames, then fell
    silent for ``silent_s`` while its publisher is still there, that it stopped (not a QoS matter);
    else the QoS hint (:func:`~oxygen_ros.ros.qos.image_qos_hint`), after the publishers' names
    when several are on the topic (two sources' frames interleave: their stamps read as frames lost)."""
    publishers = [info.qos_profile for info in infos]
    if publishers and silent_s is not None and silent_s > RATE_WINDOW_S:
        return f"; no frame for {silent_s:.1f} s after {received} received: {SILENT_PUBLISHER}"
    hint = image_qos_hint(topic, subscription, image_bytes, publishers)
    if len(infos) > 1:
        names = ", ".join(sorted(f"{i.node_namespace.rstrip('/')}/{i.node_name}" for i in infos))
        hint = (f"; {len(infos)} publishers on {topic} ({names}): their frames interleave as one camera's (a "
                "second driver, a bag playing beside the camera, another agent on this ROS_DOMAIN_ID?)" + hint)
    return hint

"""How late a control tick in the frame worker's process would run, without ROS.

The inference node runs its control tick on one thread and the frames on
another, in one Python process: they share the interpreter lock and, on a small
machine, the cores. :class:`TickProbe` is a thread that wakes every
``period_s`` (absolute deadlines, as a ROS timer does) and records how late it
woke and got the lock, which is what a tick's callback would see. A tick a
period or more late skips the periods it missed, as rcl's timer does (it
never runs them in a burst to catch up); they are counted in :attr:`TickProbe.missed`. With a
:class:`~.tick_guard.TickGuard` it tells the guard about every tick, as the node
does, so that the worker steps aside for them (``yield_to_ticks``).

:func:`frames_beside_ticks` runs frames back to back beside a probe: the
process-level part of the agent's tick jitter, measured without DDS, other
nodes or other processes (``oxygen-bench --tick-probe``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

from .tick_guard import TickGuard


class TickProbe:
    """A thread ticking every ``period_s`` from :meth:`start` to :meth:`stop`; :attr:`late_ms` holds
    each tick's lateness (ms). ``guard``: told of every tick (:meth:`TickGuard.tick_served`)."""

    def __init__(self, period_s: float = 0.002, guard: TickGuard | None = None):
        if period_s <= 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")
        self.period_ns = round(period_s * 1e9)
        self.guard = guard
        self.late_ms: list[float] = []
        self.missed = 0  # periods skipped after ticks a period or more late
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="oxygen-tick-probe", daemon=True)

    def start(self) -> TickProbe:
        self._thread.start()
        return self

    def stop(self) -> np.ndarray:
        """Stop ticking; the lateness of every tick (ms)."""
        self._stop.set()
        self._thread.join()
        return np.asarray(self.late_ms)

    def _run(self) -> None:
        due = time.monotonic_ns()
        while not self._stop.is_set():
            due += self.period_ns
            wait = due - time.monotonic_ns()
            if wait > 0:
                time.sleep(wait / 1e9)
            late = time.monotonic_ns() - due
            self.late_ms.append(late / 1e6)
            if late >= self.period_ns:  # as rcl's timer: the next call is the next period still ahead
                skipped = late // self.period_ns
                due += skipped * self.period_ns
                self.missed += skipped
            if self.guard is not None:
                self.guard.tick_served(due + self.period_ns)


def lateness_summary(late_ms: np.ndarray, over_ms: float = 2.0, missed: int = 0) -> dict:
    """Median, p99 and largest lateness (ms), the share of ticks later than ``over_ms``, and the
    ``missed`` periods (:attr:`TickProbe.missed`)."""
    late = np.asarray(late_ms, dtype=float)
    if late.size == 0:
        raise ValueError("no tick was recorded")
    return {"ticks": int(late.size), "missed": int(missed), "late_p50_ms": float(np.percentile(late, 50)),
            "late_p99_ms": float(np.percentile(late, 99)), "late_max_ms": float(late.max()),
            "over_ms": over_ms, "share_over": float((late > over_ms).mean())}


def frames_beside_ticks(frame: Callable[[], None], seconds: float, *, period_s: float = 0.002,
                        rest_s: float = 0.005, guard: TickGuard | None = None
                        ) -> tuple[np.ndarray, list[float], int]:
    """Run ``frame`` over and over for ``seconds`` (resting ``rest_s`` after each, as the worker
    waits for the next observation) beside a :class:`TickProbe`; the ticks' lateness (ms),
    each frame's time (ms) and the periods the ticks missed. With ``guard``, the probe tells it
    of every tick and it is told when
    each frame ends (the engine's ``pause_point`` should be ``guard.pause_point``)."""
    probe = TickProbe(period_s, guard).start()
    frames_ms = []
    end = time.perf_counter() + seconds
    try:
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            frame()
            frames_ms.append((time.perf_counter() - t0) * 1e3)
            if guard is not None:
                guard.frame_done()
            time.sleep(rest_s)
    finally:
        late = probe.stop()
    return late, frames_ms, probe.missed

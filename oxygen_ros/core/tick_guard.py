"""Let the control tick run before a frame's next piece of work (no ROS).

In one Python process the frame worker and the control-loop timer share one
interpreter lock. A frame is Python dispatching hundreds of small tensor
operations, so a tick that falls due while a frame runs waits for the lock
(Python hands it over only every ``sys.getswitchinterval()``, and again for
every call that releases it on the tick's way to the publisher). Measured on
the tiny demo: every tick later than 1.5 ms fell inside a frame.

:class:`TickGuard` is the engine's ``pause_point``: before each piece of a
frame (the prefill, one denoise step, one decode step) the worker asks whether
that piece, judged by how long that kind of piece took last time, would hold a
tick back by more than ``tolerance_ms`` (it would end more than that after the
tick falls due); if so, it waits without holding the lock until the tick has
been served (or ``max_wait_ms`` has passed), then goes on. A frame loses about
the tick's own run time plus what was left to its due time, for each tick it
steps aside for.

The control-loop thread calls :meth:`tick_served` after each tick with the
time the next one is due; the worker calls :meth:`pause_point` (through
``Engine.pause_point``) and :meth:`frame_done` after each frame. Times are
``time.monotonic_ns``. The ``parallel`` setting runs two threads' pieces at once: each
thread's piece is timed on its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

#: how often (s) a thread running Python hands the interpreter lock to one waiting for it, in a
#: process that runs the control tick beside the frames (``sys.setswitchinterval``; Python's default 5 ms)
SWITCH_INTERVAL_S = 0.001
#: first guesses of each piece's length (ms) until one has been measured
INITIAL_WORK_MS = {"prefill": 3.0, "denoise": 1.0, "decode": 1.0}
#: weight of the newest measurement in the moving average of a piece's length
SMOOTHING = 0.2


class TickGuard:
    def __init__(self, tolerance_ms: float = 0.5, max_wait_ms: float = 5.0,
                 clock: Callable[[], int] = time.monotonic_ns):
        if tolerance_ms < 0 or max_wait_ms <= 0:
            raise ValueError(f"tolerance_ms must be >= 0 and max_wait_ms > 0, got {tolerance_ms}, {max_wait_ms}")
        self.tolerance_ns = round(tolerance_ms * 1e6)
        self.max_wait_ns = round(max_wait_ms * 1e6)
        self.clock = clock
        self._cond = threading.Condition()
        self._served = 0  # ticks served so far
        self._next_due: int | None = None  # when the next tick is due
        self._waiting = 0  # threads of the worker waiting for a tick
        self.work_ms = dict(INITIAL_WORK_MS)  # each kind of piece's length (moving average)
        self._current: dict[int, tuple[str, int]] = {}  # by thread: the piece it runs now and when it started
        self.pauses = 0  # pauses made
        self.paused_ns = 0  # time spent in them

    # -- control-loop thread
    def tick_served(self, next_due_ns: int) -> None:
        """A tick has published; the next one is due at ``next_due_ns``."""
        with self._cond:
            self._served += 1
            self._next_due = next_due_ns
            waiting = self._waiting
            self._cond.notify_all()
        if waiting:
            time.sleep(0)  # hand the interpreter lock to the worker now, not at the next switch interval

    # -- worker thread
    def pause_point(self, work: str) -> None:
        """Before a piece of ``work``: wait for the tick if the piece would hold it back too long."""
        now, thread = self.clock(), threading.get_ident()
        self._finish_current(thread, now)
        with self._cond:
            due, served = self._next_due, self._served
            expected_ns = round(self.work_ms.get(work, max(self.work_ms.values())) * 1e6)
            if due is not None and due - expected_ns + self.tolerance_ns <= now <= due + self.max_wait_ns:
                deadline = max(now, due) + self.max_wait_ns
                self.pauses += 1
                self._waiting += 1
                while self._served == served:
                    left = deadline - self.clock()
                    if left <= 0:
                        break
                    self._cond.wait(left / 1e9)
                self._waiting -= 1
            start = self.clock()
            self.paused_ns += start - now
            self._current[thread] = (work, start)

    def frame_done(self) -> None:
        """The frame has ended: the length of its last pieces is known now."""
        now = self.clock()
        for thread in list(self._current):
            self._finish_current(thread, now)

    def _finish_current(self, thread: int, now: int) -> None:
        with self._cond:
            current = self._current.pop(thread, None)
            if current is not None:
                work, start = current
                self.work_ms[work] += SMOOTHING * ((now - start) / 1e6 - self.work_ms[work])

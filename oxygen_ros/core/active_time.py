"""Seconds spent active, summed over the spells between ``start`` and ``stop`` (no ROS).

The inference node's control tick runs only while the node is active: a lifecycle
node deactivated and activated again, or shut down, ticks in spells. A tick rate
over a window is its ticks over the active seconds in it (:class:`ActiveTime`),
not over the window's wall time, which counts the spells without ticks too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class ActiveTime:
    """A stopwatch that pauses: :meth:`seconds` sums every spell from :meth:`start` to :meth:`stop`
    (the current one up to now). A second start or stop in a row changes nothing."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()  # started and stopped by transitions, read by the agent's report
        self._total = 0.0
        self._since: float | None = None

    def start(self) -> None:
        with self._lock:
            if self._since is None:
                self._since = self._clock()

    def stop(self) -> None:
        with self._lock:
            if self._since is not None:
                self._total += self._clock() - self._since
                self._since = None

    def seconds(self) -> float:
        with self._lock:
            return self._total + (self._clock() - self._since if self._since is not None else 0.0)

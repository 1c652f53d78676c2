"""Rolling statistics for the inference node's diagnostics and the agent's report (no ROS).

* :func:`percentile` - linear-interpolation percentile of a sequence (NaN when empty).
* :class:`Rolling` - the last ``maxlen`` samples: mean, percentiles, min, max.
* :class:`WindowRate` - events per second over a sliding time window.
* :func:`action_frequency` - the paper's action frequency ``f = H / T``.

All are plain Python with their own lock, so the node's worker thread can add
samples while its diagnostics timer reads them.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between the
    closest ranks (numpy's default); NaN for no values."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    xs = sorted(float(v) for v in values)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


class Rolling:
    """The last ``maxlen`` samples of one quantity."""

    def __init__(self, maxlen: int = 1000):
        if maxlen < 1:
            raise ValueError(f"maxlen must be >= 1, got {maxlen}")
        self._values: deque[float] = deque(maxlen=maxlen)
        self._lock = threading.Lock()
        self.total = 0  # samples ever added

    def add(self, value: float) -> None:
        with self._lock:
            self._values.append(float(value))
            self.total += 1

    def values(self) -> list[float]:
        with self._lock:
            return list(self._values)

    def __len__(self) -> int:
        with self._lock:
            return len(self._values)

    @property
    def last(self) -> float:
        with self._lock:
            return self._values[-1] if self._values else math.nan

    def mean(self) -> float:
        v = self.values()
        return sum(v) / len(v) if v else math.nan

    def percentile(self, q: float) -> float:
        return percentile(self.values(), q)

    def max(self) -> float:
        v = self.values()
        return max(v) if v else math.nan

    def min(self) -> float:
        v = self.values()
        return min(v) if v else math.nan


class WindowRate:
    """Count of events per second over the last ``window_s`` seconds.

    ``add(t, n)`` records ``n`` events at time ``t`` (seconds, any monotonic
    clock, non-decreasing; ``n`` may be a quantity: seconds spent busy give a
    load, the busy fraction); ``rate(now)`` is the events in ``(now - window, now]``
    divided by the window, or, while the meter is younger than its window, the
    events in ``(first, now]`` divided by ``now - first`` (so a fresh meter is
    biased neither low nor high: 21 events 0.1 s apart read 10 per second, not 10.5).
    """

    def __init__(self, window_s: float = 5.0):
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = float(window_s)
        self._events: deque[tuple[float, int]] = deque()
        self._first: float | None = None
        self._first_n: float = 0  # the events at ``_first``: outside ``(first, now]``
        self._lock = threading.Lock()
        self.total = 0

    def add(self, t: float, n: float = 1) -> None:
        with self._lock:
            if self._first is None:
                self._first, self._first_n = t, n
            self._events.append((t, n))
            self.total += n
            self._trim(t)

    def _trim(self, now: float) -> None:
        while self._events and self._events[0][0] <= now - self.window_s:
            self._events.popleft()

    def rate(self, now: float) -> float:
        with self._lock:
            self._trim(now)
            if self._first is None:
                return 0.0
            span = now - self._first
            if span <= 0:
                return 0.0
            if span >= self.window_s:
                return sum(n for _, n in self._events) / self.window_s
            return (sum(n for _, n in self._events) - self._first_n) / span


def action_frequency(horizon: int, mean_frame_s: float) -> float:
    """``f = H / T``: actions produced per second when one frame of mean
    latency ``T`` yields ``H`` actions (NaN when ``T`` is unknown or 0)."""
    if not mean_frame_s > 0 or math.isnan(mean_frame_s):
        return math.nan
    return horizon / mean_frame_s


__all__ = ["Rolling", "WindowRate", "action_frequency", "percentile"]

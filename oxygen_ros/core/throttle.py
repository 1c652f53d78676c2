"""Log throttling by key: a repeated warning is let through at most every few seconds."""

from __future__ import annotations

import time
from typing import Any, Callable


class Throttle:
    """Lets a message through per key at most every ``period`` seconds of ``clock``."""

    def __init__(self, period: float = 5.0, clock: Callable[[], float] = time.monotonic):
        self.period, self._clock = period, clock
        self._last: dict[Any, float] = {}
        self.suppressed: dict[Any, int] = {}

    def due(self, key: Any) -> bool:
        """Would a message of ``key`` go through now (nothing counted)?"""
        last = self._last.get(key)
        return last is None or self._clock() - last >= self.period

    def __call__(self, key: Any) -> int | None:
        """None to stay quiet, else how many messages were suppressed since the last one."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.period:
            self.suppressed[key] = self.suppressed.get(key, 0) + 1
            return None
        self._last[key] = now
        return self.suppressed.pop(key, 0)

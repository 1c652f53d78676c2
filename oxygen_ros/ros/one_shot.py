"""A one-shot timer for a node: call back once, at the earliest of the times asked for.

The camera node decides again when nothing new arrives: at the end of a group's
wait for a camera's next frame or for a newer state, and when the first group's
wait for the instruction runs out. Each wait asks for its time with
:meth:`OneShot.at`; the timer keeps the earliest, and a published group cancels
it (nothing is left to decide). Times are integer nanoseconds on the node's clock.
"""

from __future__ import annotations

from collections.abc import Callable


class OneShot:
    """Calls ``callback`` once, at the earliest time asked for since it last fired or was cancelled."""

    def __init__(self, node, callback: Callable[[], None]):
        self._node = node
        self._callback = callback
        self._timer = None
        self.when_ns: int | None = None  # when it fires (None: not armed)

    def at(self, when_ns: int, now_ns: int) -> None:
        """Fire at ``when_ns`` (at once when that has passed), unless already armed for earlier."""
        if self.when_ns is not None and self.when_ns <= when_ns:
            return
        self.cancel()
        self.when_ns = when_ns
        self._timer = self._node.create_timer(max(when_ns - now_ns, 0) / 1e9, self._fire)

    def cancel(self) -> None:
        if self._timer is not None:
            self._node.destroy_timer(self._timer)
        self._timer = self.when_ns = None

    def _fire(self) -> None:
        self.cancel()
        self._callback()


__all__ = ["OneShot"]

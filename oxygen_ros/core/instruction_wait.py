"""Whether the camera node's first group waits for the instruction (no ROS in here).

A latched instruction reaches the camera node only once its publisher has been
discovered, and a camera's first frames can come before that: the first
observations, and so the robot's first actions, would then follow
``default_instruction`` instead of the task. So, until the first group has gone
out, a group that is ready is held (``HOLD``) while

* no instruction has arrived (an empty one counts: it asks for the default),
* a publisher is on the instruction topic (with none, nothing is coming), and
* less than ``wait_s`` has passed since the first group was held.

When the wait runs out, the group goes out with ``default_instruction``
(``RAN_OUT``, once: the node warns); otherwise it goes out (``GO``). Once a
group has gone out, or the instruction has come, nothing is held again. While a
group is held the frames keep coming, and each newer group replaces it.

Times are integer nanoseconds on one clock (the node's).
"""

from __future__ import annotations

from collections.abc import Callable

HOLD, GO, RAN_OUT = "hold", "go", "ran_out"


class InstructionWait:
    """See the module doc. ``wait_s``: the longest hold, in seconds (0: never hold)."""

    def __init__(self, wait_s: float):
        if not wait_s >= 0:
            raise ValueError(f"wait_s must be >= 0 seconds, got {wait_s}")
        self.wait_s = wait_s
        self.over = False  # a group went out or the instruction came: nothing is held again
        self.holding = False  # the last ready group was held
        self._since_ns: int | None = None  # when the first group was held

    def check(self, now_ns: int, publishers: Callable[[], int]) -> str:
        """A group is ready at ``now_ns``; ``publishers()``: how many are on the instruction topic
        (asked only while a group may still be held): ``HOLD`` it, or let it go (``GO``;
        ``RAN_OUT``: after holding ``wait_s`` for nothing)."""
        if self.over or self.wait_s <= 0 or publishers() == 0:
            return self._end(GO)
        if self._since_ns is None:
            self._since_ns = now_ns
        if 0 <= now_ns - self._since_ns < round(self.wait_s * 1e9):  # (a clock stepped back ends the wait)
            self.holding = True
            return HOLD
        return self._end(RAN_OUT)

    @property
    def deadline_ns(self) -> int | None:
        """When the wait runs out: the held group is then to be checked again (None: none held)."""
        return self._since_ns + round(self.wait_s * 1e9) if self.holding else None

    def arrived(self) -> bool:
        """An instruction came; True when a group is held now (it can go out at once)."""
        held, self.holding, self.over = self.holding, False, True
        return held

    def _end(self, verdict: str) -> str:
        self.over, self.holding = True, False
        return verdict


__all__ = ["GO", "HOLD", "RAN_OUT", "InstructionWait"]

"""Frames failing in a row: after ``limit`` of them the action output stops until one succeeds."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FailureCount:
    limit: int  # max_consecutive_failures
    in_a_row: int = 0
    stopped: bool = False  # the action output is stopped (faulted)
    last: str = ""  # the last failure's reason

    def failed(self, reason: str) -> bool:
        """Count a failed frame; True when this one stops the action output."""
        self.in_a_row += 1
        self.last = reason
        stop = self.in_a_row >= self.limit and not self.stopped
        self.stopped = self.stopped or stop
        return stop

    def succeeded(self) -> tuple[int, bool]:
        """A frame succeeded: (failures it ends, whether the output was stopped); resets the count."""
        n, was = self.in_a_row, self.stopped
        self.in_a_row, self.stopped = 0, False
        return n, was

"""When an observation frame starts a language request: every n-th observation frame."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LanguageCadence:
    """Every ``every_n``-th observation frame (the first included) starts a language
    request; 0: none (only on demand, questions). Frames without an observation never
    start one and are not counted."""

    every_n: int
    frames: int = 0  # observation frames counted so far

    def __post_init__(self) -> None:
        if self.every_n < 0:
            raise ValueError(f"language_every_n_frames must be >= 0, got {self.every_n}")

    def next(self, has_observation: bool) -> bool:
        """Count one frame; whether it starts a language request."""
        if not has_observation:
            return False
        due = self.every_n > 0 and self.frames % self.every_n == 0
        self.frames += 1
        return due

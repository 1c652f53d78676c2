"""The per-frame language budget under a hard action deadline.

The action chunk must be ready before the previous one runs out; the
language decode steps of a frame take what is left. :class:`DecodeBudget`
keeps running estimates of the action part of a frame (prefill + denoise) and
of one batched decode step, and grants each frame the largest ``k`` (up to the
configured one) that still fits the deadline with a margin. Under overload the
budget shrinks first, down to zero decode steps in a frame, before any action
is late; it grows back as soon as there is headroom.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def frame_deadline_ms(horizon: int, control_rate_hz: float, given: float | None = None) -> float:
    """A frame's deadline: ``given`` (the node's ``frame_deadline_ms``) when > 0, else half the
    time a chunk of ``horizon`` rows covers at ``control_rate_hz`` (a frame started right after
    the previous one must end while the previous chunk still has actions)."""
    return given if given is not None and given > 0 else horizon / control_rate_hz * 1e3 / 2


@dataclass
class DecodeBudget:
    k_max: int  # the configured steps_per_frame
    deadline_ms: float  # the frame must finish within this
    margin: float = 0.9  # use at most this fraction of the deadline
    smoothing: float = 0.3  # weight of the newest measurement in the running estimates
    action_ms: float | None = field(default=None, init=False)
    step_ms: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.k_max < 0:
            raise ValueError(f"k_max must be >= 0, got {self.k_max}")
        if self.deadline_ms <= 0:
            raise ValueError(f"deadline_ms must be > 0, got {self.deadline_ms}")
        if not 0 < self.margin <= 1 or not 0 < self.smoothing <= 1:
            raise ValueError("margin and smoothing must be in (0, 1]")

    def next_k(self) -> int:
        """Decode steps to grant the next frame."""
        if self.action_ms is None:
            return self.k_max
        room = self.deadline_ms * self.margin - self.action_ms
        if room <= 0:
            return 0
        if self.step_ms is None:  # no decode step measured yet: try the full budget once
            return self.k_max
        return max(0, min(self.k_max, int(room // max(self.step_ms, 1e-6))))

    def observe(self, action_ms: float, decode_ms: float, steps: int) -> None:
        """Feed one frame's measured action time and decode time (over ``steps`` steps)."""
        self.action_ms = _blend(self.action_ms, action_ms, self.smoothing)
        if steps > 0:
            self.step_ms = _blend(self.step_ms, decode_ms / steps, self.smoothing)


def _blend(old: float | None, new: float, weight: float) -> float:
    return new if old is None else (1 - weight) * old + weight * new

"""What a frame takes besides observations (:class:`Question`) and what it returns
(:class:`FrameResult`, or :class:`FrameError` carrying the part it produced)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .requests import Request, TokenEvent


@dataclass(frozen=True)
class Question:
    """An on-demand language request: free text, answered from the newest observation."""

    text: str
    client_id: str = ""
    max_tokens: int | None = None  # default: the engine's max_decode
    robot: str = ""  # answered from this robot's newest observation ("": the only robot)
    cut: bool = False  # its text was cut before it came (the intake's character limit): its answer says so


def tokens_beyond(max_tokens: int | None, max_decode: int) -> bool:
    """Whether a question's ``max_tokens`` is outside what the engine decodes (1..max_decode;
    None: max_decode itself)."""
    return max_tokens is not None and not 1 <= max_tokens <= max_decode


class FrameError(RuntimeError):
    """A frame failed. ``result`` holds what it produced before the failure: the action
    chunks of the observations already denoised (for the first ``len(result.actions)``
    observations; a fault in language work loses no action) and the tokens already
    decoded, which must still reach their clients. The engine is consistent and the
    next frame can run."""

    def __init__(self, message: str, result: "FrameResult"):
        super().__init__(message)
        self.result = result


@dataclass
class FrameResult:
    frame_id: int
    actions: list[np.ndarray]  # one (H, action_dim) chunk per observation, robot units
    tokens: list[TokenEvent] = field(default_factory=list)
    finished: list[Request] = field(default_factory=list)
    started: list[int] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)  # live rows of each decode step
    prefill_ms: float = 0.0
    denoise_ms: float = 0.0
    decode_ms: float = 0.0
    total_ms: float = 0.0
    paused_ms: float = 0.0  # of those, time spent in ``Engine.pause_point`` (counted in the phases too)
    copy_bytes: int = 0

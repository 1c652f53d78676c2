"""Timings of the recent observation frames, kept for diagnostics and the agent's report."""

from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass


@dataclass
class FrameRecord:
    """Timings of one observation frame. ``*_ns`` are on ``time.monotonic_ns``."""

    frame_id: int
    observation_seq: int
    received_ns: int  # the observation callback
    dequeued_ns: int  # the worker took it (after any frame that was running)
    started_ns: int  # Engine.step called (after the message -> Observation conversion)
    finished_ns: int
    engine_ms: float
    paused_ms: float = 0.0  # of engine_ms, spent letting control ticks run (``yield_to_ticks``)
    first_published_ns: int | None = None  # first ActionChunk carrying this frame


class FrameRecords:
    """The newest ``limit`` frame records by engine frame id (oldest dropped first)."""

    def __init__(self, limit: int = 100_000):
        self.limit = limit
        self._records: collections.OrderedDict[int, FrameRecord] = collections.OrderedDict()

    def add(self, record: FrameRecord) -> None:
        self._records[record.frame_id] = record
        while len(self._records) > self.limit:
            self._records.popitem(last=False)

    def published(self, frame_id: int, now_ns: int) -> None:
        """The first ActionChunk carrying ``frame_id`` went out at ``now_ns``."""
        record = self._records.get(frame_id)
        if record is not None and record.first_published_ns is None:
            record.first_published_ns = now_ns

    def copy(self) -> dict[int, FrameRecord]:
        return {k: dataclasses.replace(r) for k, r in self._records.items()}

    def __len__(self) -> int:
        return len(self._records)

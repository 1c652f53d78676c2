"""One robot's inputs as the frame loop keeps them, and which robots a frame serves.

A serving loop may serve several robots from one engine: every robot has its
own :class:`RobotInputs` (its newest observation waiting, its questions and
cancels, the spacing of its observations, its failures in a row, its frame
records and counters), so that one robot's input never touches another's.
:func:`stalest_first` picks the robots whose observations a frame takes
when more are waiting than a frame can hold. :func:`noise_seed` keys a
robot's action noise by the robot and its own frame count, not by the
engine's frame or the robot's place in it.
"""

from __future__ import annotations

import collections
import threading
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .failures import FailureCount
from .frame_records import FrameRecords
from .stats import Rolling


@dataclass
class Arrival:
    """An observation as it arrived: ``payload`` is the owner's (its converted Observation), not looked into."""

    payload: Any
    seq: int
    stamp_ros_ns: int  # capture stamp (0: unset)
    received_ros_ns: int
    received_ns: int
    robot: str = ""  # whose observation it is ("": the only robot)
    noise_seed: int | None = None  # set when a job takes it (:func:`noise_seed`)


class TeeCounter:
    """A counter whose increments (``c[key] += n``) also go to a second, shared one: a
    robot's counts, with the node's totals kept beside them.

    Threads (the frame worker, the executor) increment the same keys: ``c[key] += n`` is a
    read then a write, and a write is applied as its difference from the value that thread
    read (kept per thread), under one lock, so that two increments that interleave both count.
    """

    _lock = threading.Lock()  # one for every robot's: they share the totals

    def __init__(self, own: collections.Counter, total: collections.Counter):
        self.own, self.total = own, total
        self._reads = threading.local()  # key -> the value this thread read last

    def _read(self) -> dict:
        reads = getattr(self._reads, "values", None)
        if reads is None:
            reads = self._reads.values = {}
        return reads

    def __getitem__(self, key: str) -> int:
        value = self.own[key]
        self._read()[key] = value
        return value

    def __setitem__(self, key: str, value: int) -> None:
        with self._lock:
            delta = value - self._read().pop(key, self.own[key])
            self.own[key] += delta
            self.total[key] += delta


class WaitingQuestion(NamedTuple):
    client_id: str
    text: str
    max_tokens: int | None
    robot: str = ""
    refusal: str = ""  # why it was refused, once it is (see question_intake)


@dataclass
class RobotInputs:
    """One robot's state in the frame loop (see the module doc)."""

    name: str
    failure_limit: int
    pending: Arrival | None = None
    questions: collections.deque = field(default_factory=collections.deque)  # WaitingQuestion
    cancels: list = field(default_factory=list)  # client ids whose requests end at the next job
    last_arrival_ns: int | None = None
    newest_stamp_ros_ns: int | None = None
    last_served_ns: int = -1  # monotonic time its last observation was taken by a job (-1: never)
    frames: int = 0  # observations taken by jobs so far (keys its noise)
    counters: collections.Counter = field(default_factory=collections.Counter)
    records: FrameRecords = field(default_factory=FrameRecords)
    obs_interval_ms: Rolling = field(default_factory=lambda: Rolling(50))
    total: collections.Counter = field(default_factory=collections.Counter)  # every robot's counts together

    def __post_init__(self) -> None:
        self.failures = FailureCount(self.failure_limit)
        #: what counts for this robot: ``count[key] += n`` adds to :attr:`counters` and to :attr:`total`
        self.count = TeeCounter(self.counters, self.total)

    def arrived(self, arrival: Arrival) -> bool:
        """Keep ``arrival`` as the newest observation; True when it replaced one still waiting."""
        if self.last_arrival_ns is not None:
            self.obs_interval_ms.add((arrival.received_ns - self.last_arrival_ns) / 1e6)
        self.last_arrival_ns = arrival.received_ns
        superseded = self.pending is not None
        self.pending = arrival
        stamp = arrival.stamp_ros_ns
        if stamp > 0 and (self.newest_stamp_ros_ns is None or stamp > self.newest_stamp_ros_ns):
            self.newest_stamp_ros_ns = stamp
        return superseded

    def take(self, now_ns: int, seed: int) -> Arrival | None:
        """The waiting observation, taken by a job now (its noise seed set), or None."""
        arrival, self.pending = self.pending, None
        if arrival is not None:
            arrival.noise_seed = noise_seed(seed, self.name, self.frames)
            self.frames += 1
            self.last_served_ns = now_ns
        return arrival

    def observation_due_soon(self, now_ns: int, language_ms: float) -> bool:
        """Would a language-only frame of ``language_ms`` started now still run when this robot's
        next observation is expected (from its observations' recent spacing)?"""
        if self.last_arrival_ns is None or len(self.obs_interval_ms) < 5:
            return False
        interval_ns = self.obs_interval_ms.percentile(50) * 1e6
        expected = self.last_arrival_ns + interval_ns
        return expected - 1.5 * language_ms * 1e6 <= now_ns < expected + interval_ns / 2

    def age_ms(self, now_ros_ns: int) -> float:
        """Age of its newest observation stamp (nan before the first)."""
        newest = self.newest_stamp_ros_ns
        return float("nan") if newest is None else (now_ros_ns - newest) / 1e6


def stalest_first(robots: Iterable[RobotInputs], limit: int) -> list[RobotInputs]:
    """Of the robots with an observation waiting, at most ``limit``: the longest unserved first
    (ties: in the given order); the rest wait for the next frame with their newest observation."""
    waiting = [r for r in robots if r.pending is not None]
    return sorted(waiting, key=lambda r: r.last_served_ns)[:limit]


def noise_seed(seed: int, robot: str, frame: int) -> int:
    """The action noise seed of ``robot``'s ``frame``-th observation frame."""
    return (seed * 1_000_003 + zlib.crc32(robot.encode()) * 1_009 + frame) % (1 << 62)

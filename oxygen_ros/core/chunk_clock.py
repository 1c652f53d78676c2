"""Which action of the newest chunk is due at a control tick (no ROS in here).

A model frame turns one observation into a chunk of ``H`` actions, one per
control period ``P``: row ``i`` is meant to be executed at ``origin + i * P``.
The inference node publishes, on every control tick at time ``t``, the rows
of the newest chunk from the one due at ``t`` onward, so that a consumer that
takes the first row of every message gets one action per tick.

The action *due* at ``t`` is the newest row whose due time has been reached::

    offset(t) = floor((t - origin) / P)          (0 while t < origin)

and the message's stamp is that row's due time, ``origin + offset * P``
(within one period before ``t``). Times are integer nanoseconds on one clock
(the node's ROS clock), so consecutive ticks exactly one period apart give
offsets exactly one apart; the node passes the tick's *scheduled* time
(``TimerInfo.expected_call_time``) so that callback latency cannot make an
offset repeat or skip.

The origin of a chunk (see :func:`chunk_origin`):

``"observation"`` (the node's default)
    ``origin`` = the observation's capture stamp. The rows meant for the time
    spent capturing, transporting and computing are already in the past and
    are skipped, so the robot executes each action at the time the model
    planned it for (delay compensation). The stamp is trusted only when it
    is plausibly on the node's clock: not later than one period after the
    observation arrived, and not so old that its chunk had no row left when
    it arrived. Otherwise (a bag replayed with its recorded stamps, a camera
    on another clock, no stamp at all) the chunk falls back to ``"frame_end"``.
``"frame_end"``
    the chunk is anchored at the first tick that sees it (the first tick after
    the frame finished): that tick publishes offset 0, the next offset 1, ...
    The inference latency is then not compensated, but every chunk's row 0 is
    published, whatever the clocks.

Underruns: a tick at which the newest chunk has no row left (inference fell
behind by more than the chunk) publishes nothing and is counted.

Within a chunk the offset never goes back: a clock set back (a simulation
clock reset, a wall clock stepped) publishes the last row due again until the
clock has caught up, so that no action already sent is sent after a later one.

First publications: the clock keeps, for the recent chunks, the observation
stamp and the (scheduled) time of the tick that published the chunk first
(:attr:`ChunkClock.first_ticks`); :func:`recovery_ticks` counts from them the
control ticks between a camera frame and the first chunk that came from it or
a later one (``oxygen-soak``'s recovery after a camera gap), and
:func:`capture_to_action_ms` the delay from a camera frame's stamp to its
chunk's first tick (``/diagnostics``).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import numpy as np

from .stats import percentile

NS_PER_S = 1_000_000_000
ORIGINS = ("observation", "frame_end")
#: a ChunkClock's tick counts (:meth:`ChunkClock.counts`)
COUNTS = ("ticks", "published", "underruns", "waiting")
#: first publications kept by a ChunkClock (about 6 s of a 10 Hz camera)
FIRST_TICKS_KEPT = 64


def period_ns(rate_hz: float) -> int:
    """The control period in integer nanoseconds for a rate in Hz (> 0)."""
    if not rate_hz > 0:
        raise ValueError(f"rate must be > 0 Hz, got {rate_hz!r}")
    return max(1, round(NS_PER_S / float(rate_hz)))


def chunk_origin(mode: str, *, stamp_ns: int, received_ns: int, period_ns: int, horizon: int) -> int | None:
    """The due time of row 0 (ns), or ``None`` to anchor the chunk at its first tick.

    ``stamp_ns``: the observation's capture stamp (0 if unset); ``received_ns``:
    when the node received it (same clock as the ticks). See the module doc.
    """
    if mode not in ORIGINS:
        raise ValueError(f"chunk origin must be one of {ORIGINS}, got {mode!r}")
    if mode == "frame_end" or unusable_stamp(stamp_ns=stamp_ns, received_ns=received_ns, period_ns=period_ns,
                                             horizon=horizon):
        return None
    return stamp_ns


def unusable_stamp(*, stamp_ns: int, received_ns: int, period_ns: int, horizon: int) -> str | None:
    """Why an observation's stamp cannot be its chunk's origin (then the chunk starts at the frame's
    end), or None when it can: no stamp, a stamp not on the node's clock, or a stamp so old that every
    row of the chunk was due before the observation arrived."""
    if stamp_ns <= 0:
        return "it has no stamp"
    lag = received_ns - stamp_ns
    if lag < -period_ns:
        return f"its stamp is {-lag / 1e6:.0f} ms later than its arrival (not on this node's clock?)"
    if lag >= horizon * period_ns:
        return (f"it arrived {lag / 1e6:.0f} ms after its stamp, when all {horizon} actions of its chunk "
                f"({horizon * period_ns / 1e6:.0f} ms) were due already")
    return None


@dataclass(frozen=True)
class Chunk:
    """One frame's actions and where they came from."""

    actions: np.ndarray  # (H, action_dim), robot units
    period_ns: int  # time between rows
    origin_ns: int | None  # due time of row 0; None: anchored at the first tick that sees it
    frame_id: int = 0
    observation_seq: int = 0
    observation_stamp_ns: int = 0
    ready_ns: int = 0  # when the frame finished
    #: the stamp is on the node's clock (the age counts from it): not later than the observation's arrival, and
    #: either young enough for delay compensation or vouched for by max_observation_age; not carried to the
    #: control process, which computes no age
    stamp_on_clock: bool = True

    def __post_init__(self) -> None:
        a = np.asarray(self.actions)
        if a.ndim != 2 or a.shape[0] < 1:
            raise ValueError(f"a chunk needs a (horizon >= 1, action_dim) array, got shape {a.shape}")
        if self.period_ns <= 0:
            raise ValueError(f"period_ns must be > 0, got {self.period_ns}")

    @property
    def horizon(self) -> int:
        return int(np.asarray(self.actions).shape[0])


@dataclass(frozen=True)
class Due:
    """What a tick publishes: the chunk's rows from ``offset`` on, row 0 due at ``stamp_ns``."""

    chunk: Chunk
    offset: int
    stamp_ns: int
    first: bool  # the first tick that publishes this chunk

    @property
    def actions(self) -> np.ndarray:
        return self.chunk.actions[self.offset:]


@dataclass
class ChunkClock:
    """Holds the newest chunk and answers, per tick, which of its rows are due.

    Not thread-safe by itself: the node calls :meth:`push` and :meth:`tick`
    under one lock.
    """

    chunk: Chunk | None = None
    origin_ns: int | None = None  # the current chunk's origin once known
    ticks: int = 0
    published: int = 0
    underruns: int = 0  # ticks after the first chunk with no row due
    waiting: int = 0  # ticks before any chunk arrived
    skipped_rows: int = 0  # rows of replaced chunks never published at their offset 0 .. first offset
    #: (observation stamp, tick time) of the first publication of each recent chunk, oldest first
    first_ticks: collections.deque = field(default_factory=lambda: collections.deque(maxlen=FIRST_TICKS_KEPT))
    _last_offset: int | None = field(default=None, repr=False)

    def push(self, chunk: Chunk) -> None:
        """Make ``chunk`` the newest; the previous one is dropped."""
        self.chunk, self.origin_ns, self._last_offset = chunk, chunk.origin_ns, None

    def tick(self, now_ns: int) -> Due | None:
        """The rows due at the (scheduled) tick time ``now_ns``, or ``None`` (waiting or underrun)."""
        self.ticks += 1
        c = self.chunk
        if c is None:
            self.waiting += 1
            return None
        if self.origin_ns is None:
            self.origin_ns = now_ns  # anchored: this tick publishes row 0
        offset = max(0, (now_ns - self.origin_ns) // c.period_ns)
        if self._last_offset is not None:  # a clock set back (sim time reset) holds a row, never goes back
            offset = max(offset, self._last_offset)
        if offset >= c.horizon:
            self.underruns += 1
            return None
        first = self._last_offset is None
        if first:
            self.skipped_rows += offset
            self.first_ticks.append((c.observation_stamp_ns, now_ns))
        self._last_offset = offset
        self.published += 1
        return Due(c, int(offset), int(self.origin_ns + offset * c.period_ns), first)

    def counts(self, first_ticks: bool = True) -> dict:
        """Its ticks so far (:data:`COUNTS`: all, those that published, underruns, before the first
        chunk) and, with ``first_ticks``, a copy of :attr:`first_ticks`."""
        out = {key: getattr(self, key) for key in COUNTS}
        if first_ticks:
            out["first_ticks"] = tuple(self.first_ticks)
        return out

    def age_ns(self, now_ns: int) -> int | None:
        """Age of the data behind the published actions: now minus the current chunk's
        observation stamp, as a consumer reads it from an ActionChunk (``header.stamp -
        observation_stamp``), whether the chunk is delay-compensated or starts at its frame's
        end (a late observation: the age must show it); without a stamp, or with one not on
        this clock (:attr:`Chunk.stamp_on_clock`), now minus the chunk's ready time."""
        c = self.chunk
        if c is None:
            return None
        on_clock = c.stamp_on_clock and c.observation_stamp_ns > 0
        return now_ns - (c.observation_stamp_ns if on_clock else c.ready_ns)


def capture_to_action_ms(first_ticks, span_ns: int, last: int = 10) -> float:
    """The median, over the ``last`` chunks first published (``first_ticks``: (observation stamp,
    tick time) pairs, ns) whose delay from their observation's capture stamp to that first tick
    lies within a chunk's span (``span_ns``: H control periods), of that delay (ms; NaN without
    one): the robot's delay from camera to action, where it can be compensated. With
    ``chunk_origin: observation`` the rows due in that time are skipped, so a chunk brings the
    span minus it of actions. A stamp on another clock (later than its tick, or a span or more
    behind: a chunk started at its frame's end) does not count."""
    delays = [tick - stamp for stamp, tick in list(first_ticks)[-last:] if stamp > 0]
    return percentile([d / 1e6 for d in delays if 0 <= d < span_ns], 50)


def recovery_ticks(frame_stamp_ns: int, first_ticks, period_ns: int) -> int | None:
    """Control ticks from a camera frame stamped ``frame_stamp_ns`` to the first tick that
    published a chunk from an observation no older than that frame (``first_ticks``:
    :attr:`ChunkClock.first_ticks`, oldest first): the ticks ``t`` with
    ``frame_stamp_ns < t <= tick``. ``None`` while no such chunk has gone out."""
    for stamp, tick in first_ticks:
        if stamp >= frame_stamp_ns:
            return max(0, -(-(tick - frame_stamp_ns) // period_ns))
    return None


__all__ = ["COUNTS", "FIRST_TICKS_KEPT", "NS_PER_S", "ORIGINS", "Chunk", "ChunkClock", "Due", "chunk_origin", "period_ns",
           "recovery_ticks"]

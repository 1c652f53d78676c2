"""The one owner of key/value memory: fixed slots, allocation, views, accounting.

The pool wraps a :class:`KVCache` allocated once (``slots`` sequences of
``max_len`` tokens, every layer). Prefill writes a prefix into a slot, the
action expert reads it in place, decoding appends to it. A decode step reads
the slots ``0 .. span`` as one view (rows that hold nothing are masked); slots
are handed out lowest-first, so holes left by finished requests are refilled
by the next ones and the span stays close to the number of live requests.

Nothing is copied in normal operation. Two things copy keys/values, and both
are counted in :attr:`copy_bytes`: :meth:`move` (used by :meth:`compact` when
no contiguous run of free slots is left for a frame's observations) and
:meth:`record_copy` for callers that duplicate a prefix.

The pool knows nothing about models, configs or requests: an owner is any
hashable key (:data:`SCRATCH` marks slots that hold a prefix only for the
action expert, for the length of one frame).

Threads: every method that reads or changes who holds a slot, or a slot's
length, takes the pool's lock, so two threads of one frame (the ``parallel``
setting's action and language tasks) may allocate, advance and release slots
concurrently. The K/V storage itself is not locked: each thread writes only
the slots it holds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable

from .model.cache import KVCache, SlotView

SCRATCH = "scratch"  # owner of slots that hold a prefix only for the action expert


class PoolFull(RuntimeError):
    """No free slot (or no run of free slots) is left."""


class KVPool:
    """``on_move(owner, src, dst)`` (a constructor argument) is called whenever a held slot moves."""

    def __init__(self, cache: KVCache, on_move: Callable[[Hashable, int, int], None] | None = None):
        self.cache = cache
        self._on_move = on_move
        self.capacity = cache.slots
        self._owner: list[Hashable | None] = [None] * self.capacity
        self._lengths: list[int] = [0] * self.capacity
        self._lock = threading.RLock()
        self.copy_bytes = 0

    # ------------------------------------------------------------------ queries
    @property
    def held(self) -> int:
        return sum(o is not None for o in self._owner)

    @property
    def free(self) -> int:
        return self.capacity - self.held

    def owner(self, slot: int) -> Hashable | None:
        return self._owner[slot]

    def length(self, slot: int) -> int:
        """Tokens slot ``slot`` holds (0 for a free slot)."""
        return self._lengths[slot]

    def slots_of(self, owner: Hashable) -> list[int]:
        with self._lock:
            return [s for s, o in enumerate(self._owner) if o == owner]

    def span(self) -> int:
        """One past the highest held slot (0 when empty)."""
        for s in range(self.capacity - 1, -1, -1):
            if self._owner[s] is not None:
                return s + 1
        return 0

    @property
    def bytes_reserved(self) -> int:
        return self.cache.nbytes

    @property
    def bytes_in_use(self) -> int:
        per = self.cache.bytes_per_token()
        with self._lock:
            return sum(n for n, o in zip(self._lengths, self._owner) if o is not None) * per

    def view(self, slots: range, live: list[bool] | None = None) -> SlotView:
        """A view over consecutive ``slots`` with their current lengths."""
        if len(slots) == 0 or slots.step != 1:
            raise ValueError(f"a view needs a non-empty run of consecutive slots, got {slots}")
        with self._lock:
            lengths = [self._lengths[s] for s in slots]
        return SlotView.of(slots.start, lengths, live, device=self.cache.k.device)

    # ------------------------------------------------------------------ allocation
    def allocate(self, owner: Hashable) -> int:
        """The lowest free slot."""
        return self.allocate_run(1, owner)

    def allocate_run(self, n: int, owner: Hashable) -> int:
        """The lowest run of ``n`` consecutive free slots, compacting if none exists.

        Returns the first slot; every slot of the run is held by ``owner``
        until handed over (:meth:`assign`) or released.
        """
        if n <= 0:
            raise ValueError(f"run length must be positive, got {n}")
        with self._lock:
            if self.free < n:
                raise PoolFull(f"{n} slot(s) requested, {self.free} free of {self.capacity}")
            start = self._find_run(n)
            if start is None:
                self.compact()
                start = self._find_run(n)
                assert start is not None, "compaction leaves every free slot after the held ones"
            for s in range(start, start + n):
                self._owner[s] = owner
                self._lengths[s] = 0
            return start

    def assign(self, slot: int, owner: Hashable) -> None:
        """Hand a held slot to another owner (no data moves)."""
        with self._lock:
            self._held(slot)
            self._owner[slot] = owner

    def release(self, slot: int) -> None:
        with self._lock:
            if self._owner[slot] is None:
                raise ValueError(f"slot {slot} is already free")
            self._owner[slot] = None
            self._lengths[slot] = 0

    # ------------------------------------------------------------------ lengths
    def set_length(self, slot: int, n: int) -> None:
        """Slot ``slot`` now holds ``n`` tokens (after a prefill wrote them)."""
        with self._lock:
            self._held(slot)
            if not 0 <= n <= self.cache.max_len:
                raise ValueError(f"length {n} out of range 0..{self.cache.max_len} for slot {slot}")
            self._lengths[slot] = n

    def advance(self, slot: int, n: int = 1) -> None:
        """``n`` more tokens were appended to slot ``slot`` (a question, a decode step)."""
        with self._lock:
            self.set_length(slot, self._lengths[slot] + n)

    def _held(self, slot: int) -> None:
        if self._owner[slot] is None:
            raise ValueError(f"slot {slot} is free; allocate it first")

    def _find_run(self, n: int) -> int | None:
        run = 0
        for s in range(self.capacity):
            run = run + 1 if self._owner[s] is None else 0
            if run == n:
                return s - n + 1
        return None

    # ------------------------------------------------------------------ copies
    def move(self, src: int, dst: int) -> None:
        """Move a held slot's tokens into a free slot (a counted copy)."""
        with self._lock:
            if self._owner[src] is None or self._owner[dst] is not None:
                raise ValueError(f"move needs a held source and a free destination, got {src} -> {dst}")
            n = self._lengths[src]
            self.cache.k[:, dst, :, :n] = self.cache.k[:, src, :, :n]
            self.cache.v[:, dst, :, :n] = self.cache.v[:, src, :, :n]
            self.record_copy(n)
            owner = self._owner[src]
            self._owner[dst], self._lengths[dst] = owner, n
            self._owner[src], self._lengths[src] = None, 0
        if self._on_move is not None:
            self._on_move(owner, src, dst)

    def compact(self) -> list[tuple[Hashable, int, int]]:
        """Move the highest held slots into the lowest holes until held slots are
        ``0 .. held-1``. Returns (owner, from, to) for each move."""
        moved = []
        with self._lock:
            while True:
                holes = [s for s in range(self.capacity) if self._owner[s] is None]
                top = self.span() - 1
                if not holes or top < 0 or holes[0] > top:
                    return moved
                owner = self._owner[top]
                self.move(top, holes[0])
                moved.append((owner, top, holes[0]))

    def record_copy(self, tokens: int) -> None:
        with self._lock:
            self.copy_bytes += tokens * self.cache.bytes_per_token()

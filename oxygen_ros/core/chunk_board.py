"""Each robot's newest action chunk in shared memory, for a control tick in another process (no ROS).

The frame worker and the control tick share one interpreter lock when they
share a process, and a tick that waits for it starts late (docs/control_loop_timing.md,
"Where the last milliseconds go"). A tick in a process of its own needs each robot's
newest :class:`~oxygen_ros.core.chunk_clock.Chunk`: this board holds it, one
fixed slot per robot, allocated once (``robots x horizon x action_dim``
float64 actions and eight int64 fields), so nothing is copied that grows with
anything and no pickling runs on the tick's path.

One writer per board (the frame worker, under the node's lock), any number
of readers. Each slot is guarded by a sequence lock: the writer makes the
slot's version odd, writes, and makes it even again; a reader copies the slot
and keeps the copy only if the version was even and unchanged around it. A
reader therefore never waits for the writer (which runs at normal priority and
may be preempted mid-write): it retries a few times and otherwise keeps what
it had (:class:`TornRead` says so). The version also tells a reader whether the slot changed
since its last read. The stores are ordered as x86 orders them; on a
weakly ordered CPU this needs memory barriers (not added: not tested there).
"""

from __future__ import annotations

import sys
from multiprocessing import resource_tracker, shared_memory
from typing import Optional

import numpy as np

from .chunk_clock import Chunk

#: the int64 fields of a slot, in order
FIELDS = ("version", "present", "period_ns", "origin_ns", "frame_id", "observation_seq", "observation_stamp_ns",
          "ready_ns")
_NO_ORIGIN = -1  # Chunk.origin_ns None: anchored at the first tick that sees it
READ_TRIES = 100


def attach(name: str) -> shared_memory.SharedMemory:
    """Attach to another process's block without handing it to this process's resource
    tracker: before Python 3.13 an attaching process registers the block too, and its
    tracker frees it when that process ends (or, sharing the creator's tracker, drops the
    creator's record). The creator frees it (:meth:`ChunkBoard.unlink`). Also used by
    :class:`~oxygen_ros.core.tick_board.TickBoard`."""
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, track=False)
    register = resource_tracker.register
    resource_tracker.register = lambda *args, **kwargs: None
    try:
        return shared_memory.SharedMemory(name=name)
    finally:
        resource_tracker.register = register


class TornRead(RuntimeError):
    """A slot was being written through every try of a read."""


class ChunkBoard:
    """``robots`` slots of ``horizon x action_dim`` chunks in one shared-memory block.
    ``name`` None creates the block (the writer's side; :meth:`unlink` it at the end);
    a name attaches to the block another process created (:attr:`name`) with the same sizes."""

    def __init__(self, robots: int, horizon: int, action_dim: int, name: Optional[str] = None):
        for what, value in (("robots", robots), ("horizon", horizon), ("action_dim", action_dim)):
            if int(value) < 1:
                raise ValueError(f"a chunk board needs {what} >= 1, got {value}")
        self.robots, self.horizon, self.action_dim = int(robots), int(horizon), int(action_dim)
        meta_bytes = self.robots * len(FIELDS) * 8
        size = meta_bytes + self.robots * self.horizon * self.action_dim * 8
        self._shm = shared_memory.SharedMemory(create=True, size=size) if name is None else attach(name)
        if self._shm.size < size:
            self._shm.close()
            raise ValueError(f"shared memory {name!r} holds {self._shm.size} bytes, a board of {robots} x {horizon} "
                             f"x {action_dim} needs {size}")
        self._meta = np.ndarray((self.robots, len(FIELDS)), np.int64, self._shm.buf, 0)
        self._actions = np.ndarray((self.robots, self.horizon, self.action_dim), np.float64, self._shm.buf,
                                   meta_bytes)
        if name is None:
            self._meta[:] = 0

    @property
    def name(self) -> str:
        """The block's name, for :class:`ChunkBoard` in another process."""
        return self._shm.name

    def version(self, robot: int) -> int:
        """The slot's version: it changes with every write (even when the slot is stable)."""
        return int(self._meta[robot, 0])

    def write(self, robot: int, chunk: Optional[Chunk]) -> None:
        """Make ``chunk`` robot ``robot``'s newest (None: it has none, its output stopped)."""
        meta = self._meta[robot]
        if chunk is not None:
            a = np.asarray(chunk.actions)
            if a.shape != (self.horizon, self.action_dim):
                raise ValueError(f"robot {robot}'s chunk has shape {a.shape}, the board holds "
                                 f"({self.horizon}, {self.action_dim})")
        v = int(meta[0])
        meta[0] = v + 1  # odd: being written
        if chunk is None:
            meta[1] = 0
        else:
            meta[1:] = (1, chunk.period_ns, _NO_ORIGIN if chunk.origin_ns is None else chunk.origin_ns,
                        chunk.frame_id, chunk.observation_seq, chunk.observation_stamp_ns, chunk.ready_ns)
            self._actions[robot] = a
        meta[0] = v + 2  # even: stable

    def read(self, robot: int) -> tuple[int, Optional[Chunk]]:
        """``(version, chunk)`` of robot ``robot``'s slot (chunk None: none). Raises
        :class:`TornRead` when the slot was being written through every try."""
        meta = self._meta[robot]
        for _ in range(READ_TRIES):
            v = int(meta[0])
            if v % 2:
                continue
            fields = meta.copy()
            actions = self._actions[robot].copy()
            if int(meta[0]) != v:
                continue
            if not fields[1]:
                return v, None
            origin = int(fields[3])
            return v, Chunk(actions, int(fields[2]), None if origin == _NO_ORIGIN else origin,
                            frame_id=int(fields[4]), observation_seq=int(fields[5]),
                            observation_stamp_ns=int(fields[6]), ready_ns=int(fields[7]))
        raise TornRead(f"robot {robot}'s chunk slot was being written through {READ_TRIES} reads")

    def close(self) -> None:
        """Detach this process from the block (every process, at the end)."""
        self._meta = self._actions = None
        self._shm.close()

    def unlink(self) -> None:
        """Free the block (the creator, once every reader closed or ended)."""
        self._shm.unlink()


__all__ = ["FIELDS", "READ_TRIES", "ChunkBoard", "TornRead", "attach"]

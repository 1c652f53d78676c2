"""What a control tick in another process reports back, and the settings it takes (no ROS).

The control process (:mod:`oxygen_ros.ros.control_process`) publishes every
robot's actions; the inference node still answers for them: its
``/diagnostics``, ``tick_counts()``, frame records and the agent's report
need each robot's tick counts, the first publication of each chunk and
every tick's lateness. This block carries them back, and carries to the
control process the two settings that change at run time (the tick period,
``hold_action``). Fixed sizes, allocated once:

* a header: ``state`` (:data:`READY` once the control process's publishers
  exist), ``running`` (0 while the node is inactive, else the number of its
  activate), ``period_ns`` and ``hold_last`` (written by the node),
  the ticks the timer missed and how many lateness values were written;
* per robot: its tick counts (:data:`ROBOT_FIELDS`), the origin its chunk was
  anchored at, the chunk board version it holds, and how many first
  publications were written;
* two rings: every tick's lateness (ms) and, per robot, each chunk's first
  publication ``(frame_id, observation stamp, tick time, monotonic time)``.

Each field has one writer. A count is one aligned 8-byte store, read whole; a
ring entry is written before its count is raised (x86 keeps stores in order),
so a reader that takes the entries up to the count it read sees them whole.
A reader that fell more than a ring behind gets the newest ring's worth.
"""

from __future__ import annotations

from multiprocessing import shared_memory
from typing import Optional

import numpy as np

from .chunk_board import attach

HEADER = ("state", "running", "period_ns", "hold_last", "missed_ticks", "lateness_written")
#: per robot: ticks, those that published, underruns, before the first chunk, holds, ticks with the
#: output stopped, ActionChunks published, publications failed, the subscriptions its ActionChunk
#: publisher has matched (a level, not a count); then its anchored origin, version and firsts written
ROBOT_FIELDS = ("ticks", "published", "underruns", "waiting", "hold_ticks", "ticks_faulted", "actions_published",
                "publish_errors", "subscribers")
_ROBOT = ROBOT_FIELDS + ("origin_ns", "version", "firsts_written")
READY = 1
NO_ORIGIN = -1
LATENESS_KEPT = 8192  # > 8 s at the highest control rate (1 kHz); the node reads once a second
FIRSTS_KEPT = 256  # chunks per robot


class TickBoard:
    """See the module doc. ``name`` None creates the block (the node; :meth:`unlink` it);
    a name attaches to it (the control process)."""

    def __init__(self, robots: int, name: Optional[str] = None):
        if int(robots) < 1:
            raise ValueError(f"a tick board needs robots >= 1, got {robots}")
        self.robots = int(robots)
        shapes = (("header", (len(HEADER),), np.int64), ("robot", (self.robots, len(_ROBOT)), np.int64),
                  ("lateness", (LATENESS_KEPT,), np.float64), ("firsts", (self.robots, FIRSTS_KEPT, 4), np.int64))
        size = sum(int(np.prod(shape)) * 8 for _, shape, _ in shapes)
        self._shm = shared_memory.SharedMemory(create=True, size=size) if name is None else attach(name)
        if self._shm.size < size:
            self._shm.close()
            raise ValueError(f"shared memory {name!r} holds {self._shm.size} bytes, a tick board of {robots} "
                             f"robots needs {size}")
        offset, views = 0, {}
        for key, shape, dtype in shapes:
            views[key] = np.ndarray(shape, dtype, self._shm.buf, offset)
            offset += int(np.prod(shape)) * 8
        self._header, self._robot, self._lateness, self._firsts = (views[k] for k in ("header", "robot", "lateness",
                                                                                        "firsts"))
        if name is None:
            self._header[:] = 0
            self._robot[:] = 0
            self._robot[:, _ROBOT.index("origin_ns")] = NO_ORIGIN

    @property
    def name(self) -> str:
        return self._shm.name

    def get(self, field: str) -> int:
        """A header field."""
        return int(self._header[HEADER.index(field)])

    def set(self, field: str, value: int) -> None:
        """A header field (each has one writer: see the module doc)."""
        self._header[HEADER.index(field)] = int(value)

    # ------------------------------------------------------------------ the control process writes
    def write_robot(self, robot: int, counts: dict, origin_ns: Optional[int], version: int) -> None:
        """Robot ``robot``'s tick counts (the :data:`ROBOT_FIELDS`), its chunk's anchored origin
        and the version of the chunk board's slot that chunk came from."""
        row = self._robot[robot]
        for i, key in enumerate(ROBOT_FIELDS):
            row[i] = counts[key]
        row[len(ROBOT_FIELDS)] = NO_ORIGIN if origin_ns is None else origin_ns
        row[len(ROBOT_FIELDS) + 1] = version

    def add_lateness(self, ms: float) -> None:
        n = self.get("lateness_written")
        self._lateness[n % LATENESS_KEPT] = ms
        self.set("lateness_written", n + 1)

    def add_first(self, robot: int, frame_id: int, stamp_ns: int, tick_ns: int, mono_ns: int) -> None:
        """A chunk's first publication for robot ``robot``."""
        row, i = self._robot[robot], len(_ROBOT) - 1
        n = int(row[i])
        self._firsts[robot, n % FIRSTS_KEPT] = (frame_id, stamp_ns, tick_ns, mono_ns)
        row[i] = n + 1

    # ------------------------------------------------------------------ the node reads
    def robot(self, robot: int) -> tuple[dict, Optional[int], int]:
        """Robot ``robot``'s tick counts, its chunk's anchored origin (None: not anchored) and
        the chunk board version that chunk came from."""
        row = self._robot[robot].copy()
        origin = int(row[len(ROBOT_FIELDS)])
        return ({key: int(row[i]) for i, key in enumerate(ROBOT_FIELDS)}, (None if origin == NO_ORIGIN else origin),
                int(row[len(ROBOT_FIELDS) + 1]))

    def lateness_since(self, seen: int) -> tuple[int, np.ndarray]:
        """``(written, values)``: the lateness values written after the first ``seen`` (ms, oldest first)."""
        n = self.get("lateness_written")
        first = max(seen, n - LATENESS_KEPT)
        return n, self._lateness[np.arange(first, n) % LATENESS_KEPT].copy()

    def firsts_since(self, robot: int, seen: int) -> tuple[int, np.ndarray]:
        """``(written, rows)``: robot ``robot``'s first publications after the first ``seen``,
        rows of ``(frame_id, observation stamp, tick time, monotonic time)``, oldest first."""
        n = int(self._robot[robot, len(_ROBOT) - 1])
        first = max(seen, n - FIRSTS_KEPT)
        return n, self._firsts[robot, np.arange(first, n) % FIRSTS_KEPT].copy()

    def close(self) -> None:
        self._header = self._robot = self._lateness = self._firsts = None
        self._shm.close()

    def unlink(self) -> None:
        self._shm.unlink()


__all__ = ["FIRSTS_KEPT", "HEADER", "LATENESS_KEPT", "READY", "ROBOT_FIELDS", "TickBoard"]

"""A rosbag2 bag written in segments, each one closed and listed as it ends.

A bag's storage file gets its index (MCAP) or its committed rows (SQLite3), and the bag its
``metadata.yaml``, only when it is closed: a recording killed outright (SIGKILL, out of memory,
power lost) was an unreadable file. :class:`SegmentedBagWriter` closes the storage file it
writes every ``segment_s`` seconds and starts the next: ``BAG/BAG_0.mcap``, ``BAG/BAG_1.mcap``,
... Each closed segment is synced to disk and listed in ``BAG/metadata.yaml`` (replaced
atomically), so a recording killed at any moment reads back whole but for the segment it was
writing. Each segment is written in a folder of its own (``BAG/BAG_<n>/``, rosbags names the
file after its folder), moved next to the others once closed. ``ros2 bag play`` and this
package's player read such a bag as one.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from .bags import BagError, BagWriter

METADATA = "metadata.yaml"
INFO = "rosbag2_bagfile_information"


class SegmentedBagWriter:
    """:class:`~.bags.BagWriter`'s interface (``add_topic``, ``write``, ``close``) over segments of
    ``segment_s`` seconds (of the clock ``now``, from a segment's start; a new one starts with the
    first message after that)."""

    def __init__(self, path: str | os.PathLike, storage: str, segment_s: float,
                 now: Callable[[], float] = time.monotonic):
        self.path, self.storage, self.segment_s, self._now = Path(path), storage, segment_s, now
        if self.path.exists():
            raise BagError(f"{self.path} exists already; a bag is written to a new directory")
        self.path.mkdir(parents=True)
        self._topics: dict[str, tuple[str, bool]] = {}  # topic: (type, latched), added to every segment
        self._closed: list[dict[str, Any]] = []  # each closed segment's metadata
        self._open()

    @property
    def segments(self) -> int:
        """Segments closed so far."""
        return len(self._closed)

    def add_topic(self, topic: str, msgtype: str, *, latched: bool = False) -> None:
        self._writer.add_topic(topic, msgtype, latched=latched)
        self._topics[topic] = (msgtype, latched)

    def write(self, topic: str, stamp_ns: int, raw: bytes) -> None:
        if self._now() - self._started >= self.segment_s:
            self._finish()
            self._open()
        self._writer.write(topic, stamp_ns, raw)

    def close(self) -> None:
        self._finish()

    def _open(self) -> None:
        self._staging = self.path / f"{self.path.name}_{len(self._closed)}"
        self._writer = BagWriter(self._staging, self.storage)
        for topic, (msgtype, latched) in self._topics.items():
            self._writer.add_topic(topic, msgtype, latched=latched)
        self._started = self._now()

    def _finish(self) -> None:
        """Close the segment, move its file next to the others (synced), list it in the bag's metadata."""
        self._writer.close()
        info = yaml.safe_load((self._staging / METADATA).read_text())[INFO]
        for name in info["relative_file_paths"]:
            target = self.path / name
            os.replace(self._staging / name, target)
            _sync(target)
        shutil.rmtree(self._staging)
        self._closed.append(info)
        _write_atomically(self.path / METADATA, yaml.safe_dump({INFO: merged(self._closed)}, sort_keys=False))


def merged(infos: list[dict[str, Any]]) -> dict[str, Any]:
    """One bag's metadata from its segments' (in order): their files, message counts summed,
    from the first message of any to the last."""
    spans = [(i["starting_time"]["nanoseconds_since_epoch"], i["duration"]["nanoseconds"])
             for i in infos if i["message_count"]]
    start = min((s for s, _ in spans), default=infos[0]["starting_time"]["nanoseconds_since_epoch"])
    end = max((s + d for s, d in spans), default=start)
    topics: dict[str, dict[str, Any]] = {}
    for info in infos:
        for entry in info["topics_with_message_count"]:
            name = entry["topic_metadata"]["name"]
            if name in topics:
                topics[name]["message_count"] += entry["message_count"]
            else:
                topics[name] = {**entry}
    return {**infos[0],
            "relative_file_paths": [p for i in infos for p in i["relative_file_paths"]],
            "files": [f for i in infos for f in i["files"]],
            "message_count": sum(i["message_count"] for i in infos),
            "starting_time": {"nanoseconds_since_epoch": start},
            "duration": {"nanoseconds": end - start},
            "topics_with_message_count": list(topics.values())}


def _sync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomically(path: Path, text: str) -> None:
    """``path`` holds ``text`` on disk, or what it held before: never half of it."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _sync(path.parent)


__all__ = ["SegmentedBagWriter", "merged"]

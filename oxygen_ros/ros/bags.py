"""Write and read rosbag2 bags (MCAP or SQLite3) with ``rosbags``, messages via rclpy.

Messages are serialized and deserialized by rclpy (``serialize_message`` /
``deserialize_message``), so the bytes in a bag are exactly what goes over the
wire; ``rosbags`` only stores them. Message definitions (needed by the MCAP
schema and the type hash) come from rosbags' ROS 2 Kilted type store, and for
types it lacks (``oxygen_ros/msg/*``) from the ``.msg`` files installed under
``<prefix>/share/<package>/msg/`` (or this checkout's ``msg/``).

* :func:`write_bag` / :func:`read_bag` - a whole bag as a list of
  ``(topic, message, stamp_ns)``; :class:`BagWriter` - a bag written as the
  messages come (``oxygen-record``).
* :func:`open_bag`, :func:`bag_topics`, :func:`message_class` - what the bag
  player uses to stream a bag.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rclpy.serialization import deserialize_message, serialize_message
from rosbags.interfaces import Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime
from rosbags.rosbag2 import Reader, StoragePlugin, Writer
from rosbags.typesys import Stores, get_types_from_msg, get_typestore
from rosbags.typesys.store import Typestore

STORAGES = {"mcap": StoragePlugin.MCAP, "sqlite3": StoragePlugin.SQLITE3}
BAG_VERSION = 9

_REPO_MSG_DIR = Path(__file__).resolve().parents[2] / "msg"


class BagError(ValueError):
    """A bag cannot be written or read (the message says why)."""


# --------------------------------------------------------------------------
# Types
# --------------------------------------------------------------------------


def type_name(msg_or_class: Any) -> str:
    """``pkg/msg/Type`` of a ROS message (instance or class)."""
    cls = msg_or_class if isinstance(msg_or_class, type) else type(msg_or_class)
    parts = cls.__module__.split(".")
    if len(parts) < 2 or parts[1] not in ("msg", "srv", "action") or not hasattr(cls, "_TYPE_SUPPORT"):
        raise BagError(f"{cls.__module__}.{cls.__name__} is not a ROS message class")
    return f"{parts[0]}/{parts[1]}/{cls.__name__}"


def message_class(msgtype: str) -> type:
    """The Python class of ``pkg/msg/Type`` (or ``pkg/Type``); :class:`BagError` if unavailable."""
    parts = msgtype.split("/")
    if len(parts) == 2:
        parts = [parts[0], "msg", parts[1]]
    if len(parts) != 3 or not all(parts):
        raise BagError(f"malformed message type name {msgtype!r}")
    pkg, kind, name = parts
    try:
        module = importlib.import_module(f"{pkg}.{kind}")
        return getattr(module, name)
    except (ImportError, AttributeError) as exc:
        raise BagError(f"message type {msgtype} is not available here: {exc}") from exc


def _msg_file(msgtype: str) -> Path | None:
    pkg, kind, name = msgtype.split("/")
    prefixes = [p for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p]
    candidates = [Path(p) / "share" / pkg / kind / f"{name}.msg" for p in [*prefixes, sys.prefix]]
    if pkg == "oxygen_ros":
        candidates.append(_REPO_MSG_DIR / f"{name}.msg")
    return next((c for c in candidates if c.is_file()), None)


def _dependencies(fields: list) -> Iterable[str]:
    def walk(node: tuple) -> Iterable[str]:
        kind, detail = node
        if kind.name == "NAME":
            yield detail
        elif kind.name in ("ARRAY", "SEQUENCE"):
            yield from walk(detail[0])

    for _, node in fields:
        yield from walk(node)


def _ensure_type(typestore: Typestore, msgtype: str, seen: frozenset = frozenset()) -> None:
    if msgtype in typestore.fielddefs:
        return
    if msgtype in seen:
        raise BagError(f"recursive message definition {msgtype}")
    path = _msg_file(msgtype)
    if path is None:
        raise BagError(f"no message definition for {msgtype} (looked for share/.../{msgtype.split('/')[-1]}.msg "
                       "under AMENT_PREFIX_PATH and the Python prefix)")
    types = get_types_from_msg(path.read_text(encoding="utf-8"), msgtype)
    for dep in _dependencies(types[msgtype][1]):
        _ensure_type(typestore, dep, seen | {msgtype})
    typestore.register(types)


def typestore() -> Typestore:
    return get_typestore(Stores.ROS2_KILTED)


# --------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------


def latched_qos() -> Qos:
    return Qos(
        history=QosHistory.KEEP_LAST,
        depth=1,
        reliability=QosReliability.RELIABLE,
        durability=QosDurability.TRANSIENT_LOCAL,
        deadline=QosTime(0, 0),
        lifespan=QosTime(0, 0),
        liveliness=QosLiveliness.AUTOMATIC,
        liveliness_lease_duration=QosTime(0, 0),
        avoid_ros_namespace_conventions=False,
    )


class BagWriter:
    """A rosbag2 bag being written (``with BagWriter(path, storage) as bag``): a topic is added
    once with its type (:meth:`add_topic`), then its serialized messages are written as they
    come (:meth:`write`). What :func:`write_bag` and ``oxygen-record`` use."""

    def __init__(self, path: str | os.PathLike, storage: str):
        if storage not in STORAGES:
            raise BagError(f"storage must be one of {sorted(STORAGES)}, got {storage!r}")
        self.path = Path(path)
        if self.path.exists():
            raise BagError(f"{self.path} exists already; a bag is written to a new directory")
        self._typestore = typestore()
        self._writer = Writer(self.path, version=BAG_VERSION, storage_plugin=STORAGES[storage])
        self._writer.open()
        self._connections: dict[str, Any] = {}

    def add_topic(self, topic: str, msgtype: str, *, latched: bool = False) -> None:
        """Record ``topic`` carrying ``msgtype`` (``pkg/msg/Type``); ``latched``: offered with
        transient-local durability (what ``ros2 bag record`` stores for a latched publisher),
        so that the player re-publishes it latched."""
        conn = self._connections.get(topic)
        if conn is not None:
            if conn.msgtype != msgtype:
                raise BagError(f"topic {topic} carries {conn.msgtype}, cannot also write a {msgtype}")
            return
        _ensure_type(self._typestore, msgtype)
        qos = [latched_qos()] if latched else []
        self._connections[topic] = self._writer.add_connection(topic, msgtype, typestore=self._typestore,
                                                               offered_qos_profiles=qos)

    def write(self, topic: str, stamp_ns: int, raw: bytes) -> None:
        """A serialized message of ``topic`` (added before), received at ``stamp_ns``."""
        if int(stamp_ns) < 0:
            raise BagError(f"negative timestamp {stamp_ns} on {topic}")
        self._writer.write(self._connections[topic], int(stamp_ns), raw)

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> "BagWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_bag(
    path: str | os.PathLike,
    storage: str,
    messages: Sequence[tuple[str, Any, int]],
    *,
    latched_topics: Iterable[str] = (),
) -> Path:
    """Write ``(topic, message, stamp_ns)`` tuples to a new rosbag2 directory.

    ``storage`` is ``"mcap"`` or ``"sqlite3"``; ``path`` must not exist yet.
    Topics in ``latched_topics`` are recorded as latched (:meth:`BagWriter.add_topic`).
    Returns the bag's path.
    """
    latched = set(latched_topics)
    with BagWriter(path, storage) as bag:
        for topic, msg, stamp_ns in messages:
            bag.add_topic(topic, type_name(msg), latched=topic in latched)
            bag.write(topic, stamp_ns, serialize_message(msg))
    return bag.path


# --------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class BagTopic:
    name: str
    msgtype: str  # pkg/msg/Type
    count: int
    latched: bool  # recorded as offered with transient-local durability
    outdated: str = ""  # why its messages cannot be read here (:func:`outdated_definition`), else ""


#: Packages whose message definitions this package ships: a bag's recorded type hash of one of
#: their types is checked against today's (the ROS 2 wheels' own types are rclpy's to read).
OWN_PACKAGES = ("oxygen_ros",)


@functools.lru_cache(maxsize=None)
def _type_hash(msgtype: str) -> str:
    """The RIHS01 type hash of ``msgtype`` as this package defines it (what rclpy sends today)."""
    store = typestore()
    _ensure_type(store, msgtype)
    return store.hash_rihs01(msgtype)


def outdated_definition(msgtype: str, digest: str) -> str:
    """Why messages recorded as ``msgtype`` with the type hash ``digest`` cannot be read here
    (recorded with another version of this package's definition: rclpy cannot deserialize
    them), or "" (the same definition, a type not of :data:`OWN_PACKAGES`, no hash recorded)."""
    if not digest or msgtype.split("/")[0] not in OWN_PACKAGES:
        return ""
    today = _type_hash(msgtype)
    if digest == today:
        return ""
    return (f"recorded with another definition of {msgtype} (type hash {digest[:15]}..., this package's "
            f"{today[:15]}...: an older or newer oxygen_ros), which cannot be read here")


def open_bag(path: str | os.PathLike) -> Reader:
    """An open ``rosbags`` reader: a rosbag2 directory (storage from its
    metadata.yaml), or a single ``.mcap`` / ``.db3`` file."""
    path = Path(path)
    if not path.exists():
        raise BagError(f"bag {path} does not exist")
    if path.is_dir() and not (path / "metadata.yaml").is_file():
        files = sorted(str(f.relative_to(path)) for f in path.rglob("*") if f.suffix in (".mcap", ".db3"))
        raise BagError(f"bag {path} is a folder without the metadata.yaml of a rosbag2 bag: "
                       + (f"it holds {', '.join(files)}: give a file's path to open it alone (the segment a "
                          "killed recording was writing cannot be read: oxygen-record's bag is the folder above)"
                          if files else "not a bag, or a recording that never wrote one"))
    try:
        reader = Reader(path)
        reader.open()
    except Exception as exc:  # rosbags raises ReaderError, FileNotFoundError, yaml errors, ...
        raise BagError(f"cannot open bag {path}: {exc}") from exc
    return reader


def bag_topics(reader: Reader) -> dict[str, BagTopic]:
    """Topics of an open bag with their type, message count and whether latched."""
    topics: dict[str, BagTopic] = {}
    for conn in reader.connections:
        qos = getattr(conn.ext, "offered_qos_profiles", None) or []
        latched = any(getattr(q, "durability", None) == QosDurability.TRANSIENT_LOCAL for q in qos)
        old = topics.get(conn.topic)
        if old is not None and old.msgtype != conn.msgtype:
            raise BagError(f"topic {conn.topic} is recorded with two types: {old.msgtype} and {conn.msgtype}")
        topics[conn.topic] = BagTopic(
            conn.topic,
            conn.msgtype,
            (old.count if old else 0) + (conn.msgcount or 0),
            latched or (old.latched if old else False),
            (old.outdated if old else "") or outdated_definition(conn.msgtype, conn.digest),
        )
    return topics


def read_bag(path: str | os.PathLike, topics: Iterable[str] | None = None) -> list[tuple[str, Any, int]]:
    """Every message of a bag as ``(topic, message, stamp_ns)``, in timestamp order (of ``topics``
    only, when given). BagError naming a topic recorded with another definition of one of this
    package's types (:func:`outdated_definition`) and the topics that can be read."""
    reader = open_bag(path)
    try:
        recorded = bag_topics(reader)
        wanted = set(recorded) if topics is None else set(topics) & set(recorded)
        outdated = {t: recorded[t].outdated for t in sorted(wanted) if recorded[t].outdated}
        if outdated:
            readable = sorted(t for t in recorded if not recorded[t].outdated)
            raise BagError(f"bag {path}: " + "; ".join(f"topic {t} was {why}" for t, why in outdated.items())
                           + f". Read the others with read_bag(path, topics={readable})")
        classes = {t: message_class(recorded[t].msgtype) for t in wanted}
        return [
            (conn.topic, deserialize_message(raw, classes[conn.topic]), int(stamp))
            for conn, stamp, raw in reader.messages() if conn.topic in wanted
        ]
    finally:
        reader.close()


__all__ = [
    "BagError",
    "BagWriter",
    "BagTopic",
    "bag_topics",
    "message_class",
    "open_bag",
    "outdated_definition",
    "read_bag",
    "type_name",
    "write_bag",
]

"""What a node's parameters files give it, and what in them it does not get.

rcl gives a node the sections of its ``--params-file`` files whose key matches its
fully-qualified name (:mod:`.params_sections`), and says nothing of the others: a node
started by hand in a namespace or under another name (``camera_node --ros-args -r
__ns:=/robot1 --params-file my_robot.yaml``) silently gets none of a bare
``oxygen_camera:`` section, which is ``/oxygen_camera``'s alone. So every node of this
package reads, at start, the files it was given (the ``--params-file`` arguments of its
process and of its own ``cli_args``, :func:`node_start`) and warns, naming the file
(:func:`section_warnings`), of

* a section naming the node by its plain or default name (``oxygen_camera``) at the
  root, in the node's own namespace or under a wildcard, that does not match its
  fully-qualified name, unless the node is given each of that section's parameters
  otherwise (``oxygen-agent`` and the launch file give a robot's nodes their generic
  section's parameters themselves, see :mod:`.robot_plan`);
* a section whose node name is close to the node's but misspelt (``oxygen_camra``).

A file serves several nodes: the sections of this package's other nodes
(:data:`PACKAGE_NODES`), of the node's name in another namespace (another robot's) and
shared sections are not warned of. A shared section's key ends in a wildcard (``/**``,
``/robot1/*``): it holds the parameters of several nodes by design, so a parameter a node
gets from shared sections only (:func:`shared_only`) is not warned of as unknown when it
is another node's of this package (:mod:`.parameters`); a name that is no node's still is.

rclpy reads a subscription's ``qos_overrides.<topic>.subscription.<policy>`` by the topic's
resolved name (after remapping) and ignores any other: the camera node warns of those that
name none of its image subscriptions (:func:`warn_unused_qos_overrides`). No rclpy here.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .params_sections import QOS_OVERRIDES, key_matches, read_sections

#: This package's nodes by default name: where each one's parameter table is (module, attribute).
PACKAGE_NODES: dict[str, tuple[str, str]] = {
    "oxygen_camera": ("oxygen_ros.ros.camera_parameters", "PARAMETERS"),
    "oxygen_inference": ("oxygen_ros.ros.inference_parameters", "PARAMETERS"),
    "oxygen_synthetic_camera": ("oxygen_ros.ros.synthetic_camera", "SYNTHETIC_CAMERA_PARAMETERS"),
    "oxygen_bag_player": ("oxygen_ros.ros.bag_player", "BAG_PLAYER_PARAMETERS"),
}
#: a section name at least this close to the node's (difflib's ratio) is taken for a misspelling
CLOSE = 0.8

Sections = list[tuple[str, dict[str, Any]]]


@dataclass(frozen=True)
class NodeStart:
    """What a node was started with: its default ``name`` (its class's) and its ROS ``arguments``
    (the process's, then its own ``cli_args``)."""

    name: str
    arguments: tuple[str, ...] = ()


def node_start(name: str, kwargs: Mapping[str, Any], argv: Sequence[str] | None = None) -> NodeStart:
    """The :class:`NodeStart` of a node of default name ``name`` built with ``kwargs`` (those of
    rclpy's ``Node``): the process's arguments (``argv``, default ``sys.argv``, unless
    ``use_global_arguments=False``), then its ``cli_args``."""
    own = list(kwargs.get("cli_args") or [])
    process = list(sys.argv if argv is None else argv) if kwargs.get("use_global_arguments", True) else []
    return NodeStart(name, tuple(process + own))


def params_files(arguments: Iterable[str]) -> list[str]:
    """The ``--params-file`` paths among the ROS arguments of ``arguments`` (those between
    ``--ros-args`` and ``--``), in order, each once."""
    files, ros, items = [], False, iter(arguments)
    for arg in items:
        if arg == "--ros-args":
            ros = True
        elif arg == "--":
            ros = False
        elif ros and arg == "--params-file" and (path := next(items, None)):
            files.append(path)
    return list(dict.fromkeys(files))


def read_files(arguments: Iterable[str]) -> list[tuple[str, Sections]]:
    """``(path, its sections)`` of each parameters file in ``arguments``; a file that cannot be
    read here is left out (rcl read it, or the node would not have started)."""
    out = []
    for path in params_files(arguments):
        try:
            out.append((path, read_sections(path)))
        except ValueError:
            continue
    return out


def is_shared(key: str) -> bool:
    """Whether the section ``key`` names no node by name (``/**``, ``/robot1/*``)."""
    return key.rpartition("/")[2] in ("*", "**")


def shared_only(files: list[tuple[str, Sections]], fqn: str) -> set[str]:
    """The parameters the node ``fqn`` gets from shared sections (:func:`is_shared`) only."""
    shared, named = set(), set()
    for _, sections in files:
        for key, params in sections:
            if key_matches(key, fqn):
                (shared if is_shared(key) else named).update(params)
    return shared - named


def _reached(name: str, given: Collection[str]) -> bool:
    """Whether the parameter ``name`` of a section that does not apply is given to the node
    otherwise; a QoS override counts under a robot's prefix too (``qos_overrides./left/camera/...``
    for ``qos_overrides./camera/...``)."""
    if name in given:
        return True
    rest = name[len(QOS_OVERRIDES):]
    return name.startswith(QOS_OVERRIDES) and any(g.startswith(QOS_OVERRIDES) and g.endswith(rest) for g in given)


def section_warnings(files: list[tuple[str, Sections]], fqn: str, default_name: str,
                     given: Collection[str]) -> list[str]:
    """What to warn of in ``files`` for the node ``fqn`` of default name ``default_name``, given
    the parameters ``given`` (see the module doc): one line per section."""
    namespace, _, node = fqn.rpartition("/")
    names = {node, default_name}
    out = []
    for path, sections in files:
        for key in dict.fromkeys(k for k, _ in sections):
            prefix, _, base = key.rpartition("/")
            if key_matches(key, fqn) or is_shared(key) or (prefix not in ("", namespace) and "*" not in prefix):
                continue
            params = {n for k, p in sections if k == key for n in p}
            if base in names:
                if not all(_reached(p, given) for p in params):
                    out.append(f"params file {path}: section {key!r} does not apply to this node, {fqn} (rcl "
                               f"matches sections by the full name): name it {fqn!r}, '/**/{node}' or '/**'")
            elif base not in PACKAGE_NODES and difflib.get_close_matches(base, names, 1, CLOSE):
                meant = f"{prefix}/{node}" if "*" in prefix else fqn
                out.append(f"params file {path}: section {key!r} names no node; is it this node, {fqn}, misspelt? "
                           f"its parameters are not used (did you mean {meant!r}?)")
    return out


def package_tables() -> dict[str, tuple]:
    """The parameter table of each node of :data:`PACKAGE_NODES` (imported on demand: the
    inference node's table brings torch)."""
    import importlib

    return {name: getattr(importlib.import_module(module), attribute)
            for name, (module, attribute) in PACKAGE_NODES.items()}


def unused_qos_overrides(given: Collection[str], topics: Sequence[str], shared: Collection[str]) -> list[str]:
    """The subscription QoS overrides of ``given`` (not from shared sections only) that name none of
    ``topics`` (the node's subscriptions that take overrides, as remapped): rclpy reads
    ``qos_overrides.<topic>.subscription.<policy>`` by the resolved topic name only."""
    out = []
    for name in sorted(given):
        topic, marker, _ = name[len(QOS_OVERRIDES):].rpartition(".subscription.")
        if name.startswith(QOS_OVERRIDES) and marker and topic not in topics and name not in shared:
            out.append(name)
    return out


def warn_unused_qos_overrides(node, topics: Sequence[str], start: NodeStart) -> None:
    """One warning in ``node``'s log naming its :func:`unused_qos_overrides` and the topics they
    could apply to (nothing when there are none)."""
    shared = shared_only(read_files(start.arguments), node.get_fully_qualified_name())
    unused = unused_qos_overrides(getattr(node, "_parameter_overrides", {}), topics, shared)
    if unused:
        node.get_logger().warning(
            f"QoS override(s) ignored: {', '.join(unused)}: this node subscribes to no such topic (overrides are "
            f"matched by the topic's name after remapping); its subscriptions that take them: "
            f"{', '.join(f'qos_overrides.{t}.subscription.{{reliability,depth}}' for t in topics)}")


__all__ = ["NodeStart", "PACKAGE_NODES", "is_shared", "node_start", "package_tables", "params_files",
           "read_files", "section_warnings", "shared_only", "unused_qos_overrides", "warn_unused_qos_overrides"]

"""Which sections of a ROS 2 parameters file a node gets, worked out the way rcl does.

A parameters file maps node names to ``ros__parameters``; rcl gives a node
the parameters of every section whose key matches the node's fully-qualified
name, later sections overriding earlier ones (file order, whatever their
specificity). Checked against rclpy (Kilted, Jazzy):

* a key without a leading ``/`` is taken as absolute: ``oxygen_camera``
  matches ``/oxygen_camera`` only, never ``/left/oxygen_camera``;
  ``left/oxygen_camera`` and ``/left/oxygen_camera`` match the latter;
* nested keys name the same thing: ``left: {oxygen_camera: {ros__parameters: ...}}``
  is ``/left/oxygen_camera``;
* ``/*`` stands for exactly one name token, ``/**`` for any number (none
  too): ``/**/oxygen_camera`` matches ``/oxygen_camera`` and
  ``/left/oxygen_camera``, ``/**`` every node;
* nested parameter mappings are flattened with dots (``qos_overrides:
  {/camera/image_raw: {subscription: {depth: 2}}}`` is the parameter
  ``qos_overrides./camera/image_raw.subscription.depth``).

The plan of several robots (:mod:`.robot_plan`) reads a file with these rules,
so that a node started in a robot's namespace gets what it would get without
one (the generic ``oxygen_camera`` section, which rcl no longer gives it)
plus its robot's own section. No rclpy here.
"""

from __future__ import annotations

import re
from typing import Any

#: the prefix of the parameters by which rclpy takes a publisher's or subscription's QoS (by resolved topic)
QOS_OVERRIDES = "qos_overrides."

PARAMS_KEY = "ros__parameters"


def read_yaml(path: str) -> Any:
    """The parameters file ``path`` as YAML; ValueError naming the file when it is missing or
    cannot be read (a syntax error's line and column given in the file)."""
    import yaml

    try:
        with open(path, encoding="utf-8") as stream:  # the stream's name: errors point into the file
            return yaml.safe_load(stream)
    except FileNotFoundError as exc:
        raise ValueError(f"parameters file {path} not found") from exc
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"parameters file {path} cannot be read: {exc}") from exc


def read_sections(path: str) -> list[tuple[str, dict[str, Any]]]:
    """The node sections of the parameters file ``path`` in file order, as
    ``(fully-qualified key, {flattened parameter: value})``; ValueError naming the
    file when it is missing, not YAML or not a mapping of node sections."""
    data = read_yaml(path)
    if data is None:
        return []
    if not isinstance(data, dict):
        raise ValueError(f"parameters file {path}: expected node sections (name: {{{PARAMS_KEY}: ...}}), "
                         f"got {type(data).__name__}")
    out: list[tuple[str, dict[str, Any]]] = []
    _collect(data, "", out, path)
    return out


def _collect(tree: dict, prefix: str, out: list, path: str) -> None:
    for key, value in tree.items():
        name = f"{prefix}/{str(key).strip('/')}" if prefix else "/" + str(key).lstrip("/")
        if not isinstance(value, dict) and prefix:  # a parameter where a section's ros__parameters should be
            raise ValueError(f"parameters file {path}: {str(key)!r} in section {prefix!r} is a value, not a section: "
                             f"a node's parameters go under {PARAMS_KEY} (is '{PARAMS_KEY}:' missing under "
                             f"{prefix.lstrip('/')!r}?)")
        if not isinstance(value, dict):
            raise ValueError(f"parameters file {path}: section {name!r} is not a mapping")
        if PARAMS_KEY in value:
            params = value[PARAMS_KEY]
            if params is None:  # rcl refuses the whole file ("Cannot have a value before ros__parameters")
                raise ValueError(f"parameters file {path}: {name}.{PARAMS_KEY} is empty, which ROS 2 refuses: "
                                 "give it a parameter or remove the section")
            if not isinstance(params, dict):
                raise ValueError(f"parameters file {path}: {name}.{PARAMS_KEY} is not a mapping")
            out.append((name, flatten(params)))
        else:
            _collect(value, name, out, path)


def flatten(params: dict, prefix: str = "") -> dict[str, Any]:
    """Nested parameter mappings as dotted names, the way rcl reads them."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            out.update(flatten(value, name))
        else:
            out[name] = value
    return out


def key_matches(key: str, fqn: str) -> bool:
    """Whether the section ``key`` (absolute, see :func:`read_sections`) names the node ``fqn``."""
    parts = []
    for token in key.strip("/").split("/"):
        if token == "**":
            parts.append("(?:/[^/]+)*")
        elif token == "*":
            parts.append("/[^/]+")
        else:
            parts.append("/" + re.escape(token))
    return re.fullmatch("".join(parts), fqn) is not None


def node_parameters(sections: list[tuple[str, dict[str, Any]]], fqn: str,
                    unless: str | None = None) -> dict[str, Any]:
    """The parameters the node ``fqn`` gets from ``sections`` (later sections win);
    with ``unless``, only from the sections that do not also match that name."""
    out: dict[str, Any] = {}
    for key, params in sections:
        if key_matches(key, fqn) and (unless is None or not key_matches(key, unless)):
            out.update(params)
    return out


__all__ = ["flatten", "key_matches", "node_parameters", "read_sections"]

"""The node plan for several robots (``robots:=left,right``), part of :func:`.plan.node_plan`.

Per robot, in the robot's namespace (``left``; node names unchanged): the
camera node, and with ``demo:=true`` the synthetic camera; then ONE inference
node in the root namespace with the parameter ``robots: [left, right]``,
which serves every robot on its ``/<robot>/...`` topics.

A robot-side node gets, as explicit parameter overrides (so that
``ros2 launch``, where launch_ros passes ``--params-file`` and then the
overrides, and ``oxygen-agent``'s ``build_nodes`` start the same thing):

1. the parameters of the node's generic section (``oxygen_camera:``, which
   rcl does not give a node in a namespace, see :mod:`.params_sections`), its
   topic parameters (:data:`ROBOT_TOPICS`, the node's defaults where the file
   has none) under ``/<robot>`` (:func:`.robots.namespaced_topic`), and so are the
   topics named in ``qos_overrides.<topic>...``;
2. over them, the robot's own section (``left/oxygen_camera:``,
   ``/left/oxygen_camera:`` or nested ``left: {oxygen_camera: ...}``) as
   written: its topics are not prefixed;
3. with ``demo:=true``: the synthetic scene's seed + the robot's index
   (unless its own section sets ``seed``), and the camera node's
   ``image_size`` 48 (the embedded model's resolution) and ``state_topic`` = that robot's synthetic
   ``joint_state_topic``.

``camera_topic:=/cam/rgb`` remaps ``/<robot>/camera/image_raw`` to
``/<robot>/cam/rgb`` in every robot's camera node and synthetic camera (the
same rule as every topic: the prefix first); an image topic a robot's own
section names is not remapped.
"""

from __future__ import annotations

import importlib
from typing import Any

from .plan_tables import CAMERA_TOPIC, DEMO_PARAMETERS, NODES, argument_overrides, node_fqn
from .params_sections import QOS_OVERRIDES, node_parameters, read_sections
from .robots import namespaced_topic, namespaced_value, parse_robots

CAMERA, SYNTHETIC, INFERENCE = "oxygen_camera", "oxygen_synthetic_camera", "oxygen_inference"

#: The topic parameters of every robot-side node: each goes under ``/<robot>``.
ROBOT_TOPICS: dict[str, tuple[str, ...]] = {
    CAMERA: ("image_topics", "compressed_image_topics", "instruction_topic", "state_topic", "observation_topic"),
    SYNTHETIC: ("image_topic", "instruction_topic", "joint_state_topic", "action_topic"),
}

#: Where each robot-side node's parameter table is (module, attribute), for the defaults.
PARAMETER_TABLES: dict[str, tuple[str, str]] = {
    CAMERA: ("oxygen_ros.ros.camera_parameters", "PARAMETERS"),
    SYNTHETIC: ("oxygen_ros.ros.synthetic_camera", "SYNTHETIC_CAMERA_PARAMETERS"),
}


def node_defaults(node: str) -> dict[str, Any]:
    """The built-in default of every parameter of the robot-side node ``node``."""
    module, attribute = PARAMETER_TABLES[node]
    return {spec.name: spec.default for spec in getattr(importlib.import_module(module), attribute)}


def planned_parameters(item: dict[str, Any], sections: list, defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a plan item's node will run with, as far as the plan can tell before it starts:
    ``defaults``, then the parameters file's ``sections`` for its name (as rcl gives them),
    then the plan's own values for it (a robot's: its merged parameters, which win)."""
    return {**(defaults or {}), **node_parameters(sections, node_fqn(item)), **item["parameters"]}


def _prefixed(robot: str, node: str, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with the topic parameters, and the topics of ``qos_overrides.<topic>.``, under ``/<robot>``."""
    out = {}
    for name, value in values.items():
        if name in ROBOT_TOPICS[node]:
            value = namespaced_value(robot, value)
        elif name.startswith(QOS_OVERRIDES):
            topic, dot, rest = name[len(QOS_OVERRIDES):].partition(".")
            name = f"{QOS_OVERRIDES}{namespaced_topic(robot, topic)}{dot}{rest}"
        out[name] = value
    return out


def robot_parameters(sections: list, node: str, robot: str, index: int, demo: bool) -> dict[str, Any]:
    """The parameter overrides of ``node`` in ``robot``'s namespace (see the module doc);
    ``index``: the robot's place in ``robots`` (0, 1, ...)."""
    defaults = node_defaults(node)
    generic = node_parameters(sections, f"/{node}")
    own = node_parameters(sections, f"/{robot}/{node}", unless=f"/{node}")
    values = {**{t: defaults[t] for t in ROBOT_TOPICS[node]}, **generic}
    values = _prefixed(robot, node, values)
    values.update(own)
    if demo and node == SYNTHETIC and "seed" not in own:
        seed = values.get("seed", defaults["seed"])
        if isinstance(seed, int) and not isinstance(seed, bool):
            values["seed"] = seed + index
    return values


def file_robots(params_file: str) -> tuple[str, ...]:
    """The robots the inference node's sections of ``params_file`` name (its ``robots``
    parameter; () when none does): a plan without the ``robots`` argument serves them,
    since the node reads them from the file anyway. ValueError naming a bad value."""
    robots = node_parameters(read_sections(params_file), f"/{INFERENCE}").get("robots", [])
    if not isinstance(robots, list) or not all(isinstance(r, str) for r in robots):
        raise ValueError(f"parameters file {params_file}: {INFERENCE}'s robots must be a list of names, "
                         f"got {robots!r}")
    return parse_robots(",".join(robots), f"parameters file {params_file}: {INFERENCE}'s robots")


def robots_plan(args: dict[str, str], robots: tuple[str, ...], demo: bool, params_file: str) -> list[dict]:
    """The plan items (see :func:`.plan.node_plan`) for ``robots``: the robot-side nodes of
    every robot in its namespace, then the inference node serving them all."""
    sections = read_sections(params_file)
    plan = []
    for spec in NODES:
        if spec.demo_only and not demo:
            continue
        if spec.name not in ROBOT_TOPICS:  # the inference node
            parameters = {**argument_overrides(spec.name, args), "robots": list(robots)}
            plan.append({"spec": spec, "namespace": "", "robot": None, "parameters": parameters, "remappings": []})
            continue
        for index, robot in enumerate(robots):
            parameters = robot_parameters(sections, spec.name, robot, index, demo)
            if demo and spec.name == CAMERA:
                synthetic = robot_parameters(sections, SYNTHETIC, robot, index, demo)
                parameters.update({**DEMO_PARAMETERS.get(CAMERA, {}), "state_topic": synthetic["joint_state_topic"]})
            remaps = []
            if spec.remap_camera and args["camera_topic"]:
                remaps = [(namespaced_topic(robot, CAMERA_TOPIC), namespaced_topic(robot, args["camera_topic"]))]
            plan.append({"spec": spec, "namespace": robot, "robot": robot, "parameters": parameters,
                         "remappings": remaps})
    return plan


__all__ = ["PARAMETER_TABLES", "ROBOT_TOPICS", "file_robots", "node_defaults", "planned_parameters", "robot_parameters",
           "robots_plan"]

"""The agent's node plan, shared by ``launch/agent.launch.py``, ``oxygen-agent`` and ``oxygen-soak``.

:func:`node_plan`: what to start for the launch arguments (the nodes of
:data:`.plan_tables.NODES`, what :data:`.plan_tables.ARGUMENTS` override;
``robots:=left,right`` makes it the plan of several robots, :mod:`.robot_plan`);
:func:`resolve` checks the parameters file too, and :func:`plan_warnings` finds
its sections that no node reads and a ``camera_topic`` that remaps no camera; :func:`build_nodes` constructs a
plan's nodes in this process; :func:`overrides_file` writes a plan item's
parameters for ``ros2 launch``; :func:`node_exit_message` says why a launch ends
when a node exits. A test keeps ``config/agent.yaml`` in step with the plan.
rclpy is imported where it is used: the launch file imports this module for the
plan alone.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml

from .plan_tables import (
    ARGUMENTS,
    CAMERA_TOPIC,
    DEMO_PARAMETERS,
    NODES,
    argument_overrides,
    default_params_file,
    node_fqn,
    node_label,
    parse_bool,
    parse_respawn,
    parse_respawn_retries,
)
from .params_sections import key_matches, read_sections, read_yaml
from .robot_plan import CAMERA, INFERENCE, file_robots, node_defaults, planned_parameters, robots_plan
from .camera_count_check import camera_count_warnings
from .robot_topics_check import robot_topic_warnings
from .robots import parse_robots, resolved_topic


def node_plan(values: dict[str, str], params_file: str | None = None) -> list[dict[str, Any]]:
    """What to start for the given argument values (missing ones: defaults):
    ``[{spec, namespace, robot, parameters: {name: value}, remappings: [(from, to)], respawn_delay}]``
    (``respawn_delay``: the seconds before the node is restarted when it exits, None when its
    exit ends the launch, as the inference node's always does)
    (``namespace`` "" and ``robot`` None but with ``robots``: see :mod:`.robot_plan`,
    which reads ``params_file``, by default the installed one). ``robots`` empty: the
    inference node's ``robots`` in ``params_file`` (its nodes must be planned too)."""
    args = {a.name: a.default for a in ARGUMENTS}
    unknown = sorted(set(values) - set(args))
    if unknown:
        named = ", ".join(f"{name!r}{_guess(name, 0.6)}" for name in unknown)
        raise ValueError(f"unknown argument(s) {named}; known: {sorted(args)}")
    args.update(values)
    demo = parse_bool("demo", args["demo"])
    respawn_delay, max_retries = parse_respawn(args), parse_respawn_retries(args)
    robots = parse_robots(args["robots"]) or file_robots(params_file or default_params_file())
    if robots:
        plan = robots_plan(args, robots, demo, params_file or default_params_file())
    else:
        plan = []
        for spec in NODES:
            if spec.demo_only and not demo:
                continue
            overrides = dict(DEMO_PARAMETERS.get(spec.name, {})) if demo else {}
            overrides.update(argument_overrides(spec.name, args))
            remaps = [(CAMERA_TOPIC, args["camera_topic"])] if spec.remap_camera and args["camera_topic"] else []
            plan.append({"spec": spec, "namespace": "", "robot": None, "parameters": overrides, "remappings": remaps})
    for item in plan:  # the inference node is always required: without it no robot gets an action
        required = item["spec"].name == INFERENCE
        item["respawn_delay"] = None if required else respawn_delay
        item["respawn_max_retries"] = None if required or respawn_delay is None else max_retries
    return plan


def _guess(name: str, cutoff: float) -> str:
    """`` (did you mean 'demo'?)`` for the argument ``name`` is closest to, else ""."""
    close = difflib.get_close_matches(name, [a.name for a in ARGUMENTS], n=1, cutoff=cutoff)
    return f" (did you mean {close[0]!r}?)" if close else ""


def misspelt_arguments(names) -> list[str]:
    """A warning for each of ``names`` (a launch's configurations) that is none of the
    arguments but close to one (``demmo:=true``): ``ros2 launch`` takes any name and the launch
    would run as if it were not given. Names far from every argument are left alone: a launch
    file including this one has arguments of its own."""
    known = {a.name for a in ARGUMENTS}
    return [f"launch argument {name!r} is none of this launch's{guess}: it changes nothing"
            for name in sorted(set(names) - known) if (guess := _guess(name, 0.8))]


def resolve(values: dict[str, str]) -> tuple[list[dict[str, Any]], str]:
    """The node plan and the parameters file for the given argument values; ValueError
    naming what is wrong (an unknown argument, a bad value or robot name, a parameters
    file that is missing, unreadable or not YAML)."""
    params_file = values.get("params_file") or default_params_file()
    plan = node_plan(values, params_file)
    check_params_file(params_file)
    return plan, params_file


def plan_warnings(plan: list[dict[str, Any]], params_file: str) -> list[str]:
    """What to warn of before ``plan`` starts with ``params_file``: its sections that give their
    parameters to no node (a misspelt node name: every parameter of that node would silently
    keep its default), a camera remapping (``camera_topic``) of a topic the camera node does
    not subscribe to, robots whose topics cross or miss (:mod:`.robot_topics_check`) and a camera
    node grouping more cameras than ``max_cameras`` (:mod:`.camera_count_check`). A
    robot's node counts under its plain name too: the plan of several robots reads the
    generic sections for them (:mod:`.robot_plan`); so does every node this package can
    start (the demo's synthetic camera has its section in the installed file)."""
    sections = read_sections(params_file)
    names = {f"/{spec.name}" for spec in NODES} | {node_fqn(item) for item in plan}
    lines = []
    for key, _ in sections:
        if not any(key_matches(key, fqn) for fqn in names):
            close = difflib.get_close_matches(key, sorted(names), n=1)
            guess = f"did you mean {close[0]!r}? " if close else ""
            lines.append(f"parameters file {params_file}: section {key!r} names no node of this launch ({guess}its "
                         f"nodes: {', '.join(sorted(names))}): its parameters are not used")
    return (lines + [line for item in plan if (line := _remap_unused(item, sections))]
            + robot_topic_warnings(plan, sections) + camera_count_warnings(plan, sections))


def _remap_unused(item: dict[str, Any], sections: list) -> str | None:
    """The warning for a camera node whose camera remapping names none of its image topics."""
    if item["spec"].name != CAMERA or not item["remappings"]:
        return None
    params = planned_parameters(item, sections, node_defaults(CAMERA))
    topics = [resolved_topic(item["namespace"], t) for t in params["image_topics"]]
    (src, dst), = item["remappings"]
    if src in topics:
        return None
    return (f"camera_topic:={dst} does not change {node_label(item)}'s cameras: it remaps {src}, which is not "
            f"among its image_topics {topics}; set image_topics instead")


def check_params_file(path: str) -> None:
    """ValueError naming ``path`` unless it is a readable YAML file (the nodes would
    otherwise start on their built-in defaults, or not at all, far from the cause)."""
    if not Path(path).is_file():
        raise ValueError(f"parameters file {path} not found")
    read_yaml(path)


def exit_how(returncode: int | None) -> str:
    """How a process ended: ``exited with code 1``, ``was killed by signal 9``."""
    if returncode is not None and returncode < 0:
        return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


def ended_by_itself(returncode: int | None) -> bool:
    """Whether a process that ended with ``returncode`` exited by itself (its log says why), not
    killed by a signal (it had no chance to say anything)."""
    return returncode is None or returncode >= 0


def own_log(returncode: int | None) -> str:
    """``"; its own log above says why"`` after the exit of a process that ended by itself
    (:func:`ended_by_itself`), else ""."""
    return "; its own log above says why" if ended_by_itself(returncode) else ""


def restarts(returncode: int | None, respawn_delay: float | None, restarted: int = 0,
             max_retries: int | None = None) -> bool:
    """Whether a node (a camera side) that ended with ``returncode``, after ``restarted``
    restarts, is restarted: with ``respawn_delay`` set, unless it ended for a bad parameter or
    parameters file (2), which a restart would not mend, or was restarted ``max_retries``
    times already (None: no limit)."""
    return (respawn_delay is not None and returncode != 2
            and (max_retries is None or restarted < max_retries))


def not_restarted(returncode: int | None, max_retries: int | None) -> str:
    """Why a node of ``respawn:=true`` is not restarted (see :func:`restarts`), in parentheses."""
    if returncode == 2:
        return " (a bad parameter or parameters file: not restarted)"
    times = "once" if max_retries == 1 else f"{max_retries} times"
    return f" (restarted {times} already, respawn_max_retries:={max_retries}: not again)"


def node_exit_message(name: str, returncode: int | None, shutting_down: bool,
                      respawn_delay: float | None = None, restarted: int = 0,
                      max_retries: int | None = None) -> str | None:
    """Why the launch must end when the node ``name`` exited with ``returncode`` (after
    ``restarted`` restarts); None when the launch is shutting down anyway (Ctrl-C, another
    node's exit) or the node is restarted (:func:`restarts`). Every node of the plan is
    required: a camera node without an inference node (or the reverse) would leave the robot
    without actions and the launch looking healthy."""
    if shutting_down or restarts(returncode, respawn_delay, restarted, max_retries):
        return None
    why = not_restarted(returncode, max_retries) if respawn_delay is not None else ""
    log = " (the node's own log above says why)" if ended_by_itself(returncode) else ""
    return f"{name} {exit_how(returncode)}{why}; ending the launch{log}"


def respawn_message(name: str, returncode: int | None, respawn_delay: float, restart: int = 1,
                    max_retries: int | None = None) -> str:
    """What the log says when a camera side's node (or process) ``name`` ended and is restarted
    (its ``restart``-th restart, of at most ``max_retries``; None: no limit, not counted here)."""
    count = f", restart {restart} of {max_retries}" if max_retries is not None else ""
    why = own_log(returncode)
    return f"{name} {exit_how(returncode)}; restarting it in {respawn_delay:g} s (respawn:=true{count}{why})"


def build_nodes(plan: list[dict[str, Any]], params_file: str, nodes: list, context=None) -> list:
    """Construct the nodes of ``plan`` (see :func:`node_plan`) with ``params_file``, each
    in its namespace (in the rclpy ``context``, default: the global one), appending each
    to ``nodes`` as it is made (so a caller can destroy those already made if a later
    one fails); returns ``nodes``."""
    import importlib

    from rclpy.parameter import Parameter

    from .parameters import ParameterError

    for item in plan:
        spec = item["spec"]
        cls = getattr(importlib.import_module(spec.module), spec.cls)
        cli = ["--ros-args", "--params-file", params_file]
        for src, dst in item["remappings"]:
            cli += ["-r", f"{src}:={dst}"]
        overrides = [Parameter(k, value=v) for k, v in item["parameters"].items()]
        extra = {"namespace": item["namespace"]} if item.get("namespace") else {}
        if context is not None:
            extra["context"] = context
        try:
            nodes.append(cls(cli_args=cli, parameter_overrides=overrides, **extra))
        except ParameterError as exc:
            exc.node = exc.node or node_label(item)  # the command's last line says whose it is
            raise
    return nodes


def overrides_file(item: dict[str, Any], directory: str) -> str:
    """A parameters file in ``directory`` holding the plan item's parameters for its node
    alone (the section of its fully-qualified name); returns its path. ``ros2 launch``
    passes it after the params file, where launch_ros would take a dict: launch_ros
    refuses an empty list in a Node's parameter dict (a robot's
    ``compressed_image_topics: []``), while rcl reads it from a file as the empty
    array, as it reads the params file's own."""
    fqn = node_fqn(item)
    path = Path(directory) / f"{fqn.strip('/').replace('/', '.')}.yaml"
    path.write_text(yaml.safe_dump({fqn: {"ros__parameters": item["parameters"]}}, sort_keys=False))
    return str(path)


def parse_launch_args(items: list[str]) -> dict[str, str]:
    """``name:=value`` command-line items as ``{name: value}``; ValueError naming a bad item."""
    values = {}
    for item in items:
        if ":=" not in item:
            raise ValueError(f"expected name:=value, got {item!r}")
        name, value = item.split(":=", 1)
        values[name.strip()] = value
    return values

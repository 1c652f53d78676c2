"""The agent's node plan, shared by ``launch/agent.launch.py``, ``oxygen-agent`` and
``oxygen-soak``, and the one start-up that runs a plan's nodes in this process.

The plan: the nodes (:data:`NODES`), the launch arguments (:data:`ARGUMENTS`,
written ``name:=value``) and what they override (:func:`node_plan`); a test
keeps ``config/agent.yaml`` in step with it; ``robots:=left,right`` makes it
the plan of several robots (:mod:`.robot_plan`). The start-up (:func:`run_agent`):
the process set-up of :mod:`.process`, the nodes built from the parameters
file, the command's own nodes (a :class:`Session`), every node spun in
background threads (:class:`.spinner.Spinner`), and the teardown, whatever ends the run.
The commands themselves (status line, report, soak) live in ``oxygen_ros.tools``.

rclpy and the nodes' modules are imported where they are used: the launch file
imports this module for the plan alone.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .robot_process import INFERENCE, RobotProcessError, RobotProcesses, camera_sides
from .spinner import BACKGROUND_NICENESS, CONTROL_PATH, EXECUTORS, Spinner  # noqa: F401 (the agent's layout)

PACKAGE = "oxygen_ros"
CAMERA_TOPIC = "/camera/image_raw"  # the name `camera_topic` remaps
TRUE = ("true", "1", "yes", "on")
FALSE = ("false", "0", "no", "off")


@dataclass(frozen=True)
class NodeSpec:
    executable: str  # lib/oxygen_ros/<executable>
    name: str  # node name (and its section in the YAML)
    module: str
    cls: str
    demo_only: bool = False
    remap_camera: bool = False  # takes the camera_topic remapping


@dataclass(frozen=True)
class Argument:
    name: str
    default: str
    description: str
    node: str | None = None  # node whose parameter it overrides (when not empty)
    parameter: str | None = None
    items: bool = False  # a string-list parameter: a comma list (or a YAML list) gives its items


#: The nodes of the launch file and the agent, in start order.
NODES: tuple[NodeSpec, ...] = (
    NodeSpec("synthetic_camera", "oxygen_synthetic_camera", "oxygen_ros.ros.synthetic_camera", "SyntheticCamera",
             demo_only=True, remap_camera=True),
    NodeSpec("camera_node", "oxygen_camera", "oxygen_ros.ros.camera_node", "CameraNode", remap_camera=True),
    # the managed (lifecycle) inference node; it reaches active by itself unless autostart:=false
    NodeSpec("managed_inference_node", "oxygen_inference", "oxygen_ros.ros.managed_inference_node",
             "ManagedInferenceNode"),
)

#: The launch arguments. An empty value means "keep the parameters file's value".
ARGUMENTS: tuple[Argument, ...] = (
    Argument("params_file", "", "Parameters YAML of every node (default: the installed config/agent.yaml)."),
    Argument("model_path", "", "Checkpoint directory (empty: the YAML's, by default the embedded model).",
             "oxygen_inference", "model_path"),
    Argument("model_sizes", "", "Model sizes as a comma list of KEY=VALUE items (e.g. "
             "vision.heads=2,max_token_len=48), for a checkpoint that does not state them.",
             "oxygen_inference", "model_sizes", items=True),
    Argument("preset", "", "Random-weights preset when there is no model (tiny | pi05).",
             "oxygen_inference", "preset"),
    Argument("device", "", "Torch device (cpu | cuda | cuda:N).", "oxygen_inference", "device"),
    Argument("dtype", "", "Model precision (float32 | bfloat16).", "oxygen_inference", "dtype"),
    Argument("setting", "", "Frame setting (oxygen | shared_kv | parallel | baseline).",
             "oxygen_inference", "setting"),
    Argument("control_rate_hz", "", "Control-loop rate in Hz.", "oxygen_inference", "control_rate_hz"),
    Argument("steps_per_frame", "", "Decode steps per frame (k).", "oxygen_inference", "steps_per_frame"),
    Argument("compile", "", "Compiled model pieces (auto | on | off).", "oxygen_inference", "compile"),
    Argument("autostart", "", "false: the inference node waits for its lifecycle transitions (configure, "
             "activate) from a lifecycle manager.", "oxygen_inference", "autostart"),
    Argument("camera_topic", "", f"Camera image topic: remaps {CAMERA_TOPIC} of the camera node and the "
             "synthetic camera (empty: no remapping)."),
    Argument("demo", "false", "true: also start the synthetic closed-loop camera (never on a robot)."),
    Argument("robots", "", "Robot names, comma-separated (left,right): per robot a camera node (and with "
             "demo:=true a synthetic camera) in the robot's namespace on /<robot>/... topics, and one inference "
             "node serving them all (empty: one robot on the configured topics)."),
)

#: With demo:=true, the camera node also takes the synthetic camera's gripper
#: position as the robot state (closing the loop the way the model was trained).
DEMO_PARAMETERS: dict[str, dict[str, Any]] = {
    # the synthetic camera renders 32 px images for the embedded tiny model: pass
    # them on at that size instead of upscaling them to the YAML's 224
    "oxygen_camera": {"state_topic": "/joint_states", "image_size": 32},
}


# --------------------------------------------------------------------------
# Shared with the launch file
# --------------------------------------------------------------------------


def default_params_file() -> str:
    """The installed ``share/oxygen_ros/config/agent.yaml``, else the one next to the sources."""
    try:
        from ament_index_python.packages import (
            PackageNotFoundError,
            get_package_share_directory,
        )

        try:
            path = Path(get_package_share_directory(PACKAGE)) / "config" / "agent.yaml"
            if path.is_file():
                return str(path)
        except (PackageNotFoundError, OSError):  # OSError: AMENT_PREFIX_PATH unset
            pass
    except ImportError:
        pass
    return str(Path(__file__).resolve().parents[2] / "config" / "agent.yaml")


def parse_bool(name: str, value: str) -> bool:
    v = str(value).strip().lower()
    if v in TRUE:
        return True
    if v in FALSE:
        return False
    raise ValueError(f"argument '{name}': expected true or false, got {value!r}")


def parse_value(text: str) -> Any:
    """A launch-argument string as a parameter value, typed the way ``ros2 launch``
    and ``-p name:=value`` type it (YAML: 50 -> int, 50.0 -> float, true -> bool)."""
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return text if value is None or isinstance(value, (dict, list)) and not value else value


def argument_value(argument: Argument, text: str) -> Any:
    """The parameter value of a launch argument: typed as YAML, or (a string-list one) its comma items."""
    if argument.items and not text.lstrip().startswith("["):
        return [item.strip() for item in text.split(",") if item.strip()]
    return parse_value(text)


def argument_overrides(node: str, args: dict[str, str]) -> dict[str, Any]:
    """The parameters of ``node`` that the (non-empty) launch arguments ``args`` set."""
    return {a.parameter: argument_value(a, args[a.name]) for a in ARGUMENTS if a.node == node and args[a.name] != ""}


def node_plan(values: dict[str, str], params_file: str | None = None) -> list[dict[str, Any]]:
    """What to start for the given argument values (missing ones: defaults):
    ``[{spec, namespace, robot, parameters: {name: value}, remappings: [(from, to)]}]``
    (``namespace`` "" and ``robot`` None but with ``robots``: see :mod:`.robot_plan`,
    which reads ``params_file``, by default the installed one)."""
    from .robots import parse_robots

    args = {a.name: a.default for a in ARGUMENTS}
    unknown = sorted(set(values) - set(args))
    if unknown:
        raise ValueError(f"unknown argument(s) {unknown}; known: {sorted(args)}")
    args.update(values)
    demo = parse_bool("demo", args["demo"])
    robots = parse_robots(args["robots"])
    if robots:
        from .robot_plan import robots_plan

        return robots_plan(args, robots, demo, params_file or default_params_file())
    plan = []
    for spec in NODES:
        if spec.demo_only and not demo:
            continue
        overrides = dict(DEMO_PARAMETERS.get(spec.name, {})) if demo else {}
        overrides.update(argument_overrides(spec.name, args))
        remaps = [(CAMERA_TOPIC, args["camera_topic"])] if spec.remap_camera and args["camera_topic"] else []
        plan.append({"spec": spec, "namespace": "", "robot": None, "parameters": overrides, "remappings": remaps})
    return plan


def node_label(item: dict[str, Any]) -> str:
    """How logs name a plan item's node: ``oxygen_camera``, or ``left/oxygen_camera`` in a robot's namespace."""
    return f"{item['namespace']}/{item['spec'].name}" if item["namespace"] else item["spec"].name


def resolve(values: dict[str, str]) -> tuple[list[dict[str, Any]], str]:
    """The node plan and the parameters file for the given argument values; ValueError
    naming what is wrong (an unknown argument, a bad value or robot name, a parameters
    file that is missing, unreadable or not YAML)."""
    params_file = values.get("params_file") or default_params_file()
    plan = node_plan(values, params_file)
    check_params_file(params_file)
    return plan, params_file


def check_params_file(path: str) -> None:
    """ValueError naming ``path`` unless it is a readable YAML file (the nodes would
    otherwise start on their built-in defaults, or not at all, far from the cause)."""
    import yaml

    if not Path(path).is_file():
        raise ValueError(f"parameters file {path} not found")
    try:
        yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"parameters file {path} cannot be read: {exc}") from exc


def node_exit_message(name: str, returncode: int | None, shutting_down: bool) -> str | None:
    """Why the launch must end when the node ``name`` exited with ``returncode``; None when
    the launch is shutting down anyway (Ctrl-C, another node's exit). Every node of the
    plan is required: a camera node without an inference node (or the reverse) would
    leave the robot without actions and the launch looking healthy."""
    if shutting_down:
        return None
    if returncode is not None and returncode < 0:
        how = f"was killed by signal {-returncode}"
    else:
        how = f"exited with code {returncode}"
    return f"{name} {how}; ending the launch (the node's own log above says why)"


def build_nodes(plan: list[dict[str, Any]], params_file: str, nodes: list, context=None) -> list:
    """Construct the nodes of ``plan`` (see :func:`node_plan`) with ``params_file``, each
    in its namespace (in the rclpy ``context``, default: the global one), appending each
    to ``nodes`` as it is made (so a caller can destroy those already made if a later
    one fails); returns ``nodes``."""
    import importlib

    from rclpy.parameter import Parameter

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
        nodes.append(cls(cli_args=cli, parameter_overrides=overrides, **extra))
    return nodes


def parse_launch_args(items: list[str]) -> dict[str, str]:
    """``name:=value`` command-line items as ``{name: value}``; ValueError naming a bad item."""
    values = {}
    for item in items:
        if ":=" not in item:
            raise ValueError(f"expected name:=value, got {item!r}")
        name, value = item.split(":=", 1)
        values[name.strip()] = value
    return values


# --------------------------------------------------------------------------
# The one start-up of oxygen-agent and oxygen-soak
# --------------------------------------------------------------------------


class Agent:
    """The nodes of a plan in this process: built with the parameters file, then the
    command's own nodes (:meth:`add`), spun in background threads, destroyed at the end;
    ``robot_processes``: every robot's camera side in a process of its own (:mod:`.robot_process`)."""

    def __init__(self, plan: list[dict[str, Any]], params_file: str, robot_processes: bool = False,
                 background_niceness: int = BACKGROUND_NICENESS):
        self.plan, self.params_file = plan, params_file
        sides = camera_sides(plan) if robot_processes else {}
        self.local = [item for item in plan if not robot_processes or item["spec"].name == INFERENCE]
        self.nodes: list = []  # in the order made: the plan's (here), then the command's own
        self.spinner: Spinner | None = None
        self.children = RobotProcesses(sides, params_file, background_niceness)  # started by build()

    def build(self) -> None:
        """Start the robots' processes, construct this process's nodes (kept for :meth:`close` on a failure)."""
        self.children.start()
        build_nodes(self.local, self.params_file, self.nodes)
        self.children.wait_ready()

    def node(self, name: str, robot: str | None = None):
        """The node called ``name`` (in ``robot``'s namespace, or the root one); KeyError
        listing the nodes when there is none."""
        namespace = f"/{robot}" if robot else "/"
        for node in self.nodes:
            if node.get_name() == name and node.get_namespace() == namespace:
                return node
        raise KeyError(f"no node {name!r} in namespace {namespace} of this agent "
                       f"(nodes: {[n.get_fully_qualified_name() for n in self.nodes]})")

    @property
    def robots(self) -> tuple[str, ...]:
        """The robots of the plan (empty: one robot on the configured topics)."""
        return tuple(dict.fromkeys(item["robot"] for item in self.plan if item.get("robot")))

    @property
    def inference(self):
        return self.node(INFERENCE)

    def add(self, node):
        """Add a node of the command's own (spun and destroyed with the others); returns it."""
        self.nodes.append(node)
        return node

    def spin(self, executor: str = "split", background_niceness: int = BACKGROUND_NICENESS) -> None:
        """Freeze the start-up garbage, then spin every node: the inference node first,
        then the command's own, then the rest of the plan's."""
        from .process import settle_garbage_collector

        settle_garbage_collector()
        built, own = self.nodes[:len(self.local)], self.nodes[len(self.local):]
        inference = self.inference
        order = [inference, *own, *(n for n in built if n is not inference)]
        self.spinner = Spinner(executor, order, background_niceness=background_niceness)

    def alive(self) -> bool:
        """Every node still runs: each executor spins and the inference node's frame worker lives."""
        return self.spinner is not None and self.failure() is None

    def failure(self) -> str | None:
        """Why a node of this agent, or a robot's child process, no longer runs (None while all do)."""
        if self.spinner is not None and not self.spinner.alive():
            return self.spinner.failure or "an executor stopped"
        if self.spinner is not None and (failure := self.children.failure()) is not None:
            return failure
        worker = getattr(self.inference, "worker", None)
        if self.spinner is not None and worker is not None and not worker.alive:
            return f"{INFERENCE}: its frame worker stopped"
        return None

    def close(self) -> None:
        """Stop the robots' processes and spinning, destroy every node (last made first), shut rclpy down."""
        import rclpy

        self.children.stop()
        if self.spinner is not None:
            self.spinner.shutdown()
        for node in reversed(self.nodes):
            node.destroy_node()
        rclpy.try_shutdown()


class Session(Protocol):
    """What a command adds to the agent's start-up (see :func:`run_agent`)."""

    def start(self, agent: Agent) -> None:
        """The plan's nodes exist: make the command's own (``agent.add``) before spinning."""

    def run(self, agent: Agent) -> int:
        """The nodes spin: the command's main loop; returns the exit status."""

    def finish(self, agent: Agent) -> None:
        """After the main loop, whatever ended it (even Ctrl-C), while the nodes still spin."""


def run_agent(prog: str, values: dict[str, str], session: Session, executor: str = "split",
              background_niceness: int = BACKGROUND_NICENESS, robot_processes: bool = False) -> int:
    """Run the plan's nodes for the launch-argument ``values`` in this process (with ``robot_processes``
    the robots' camera sides in their own) with ``session``; the exit status: 2 for a bad argument or
    parameter (printed after ``prog:``), 1 when a node or a robot's process stopped, else
    ``session.run``'s (0 when interrupted by Ctrl-C or SIGTERM)."""
    try:
        plan, params_file = resolve(values)
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    from rclpy.executors import ExternalShutdownException

    from .parameters import ParameterError
    from .process import init_control_process

    init_control_process([])
    print(f"{prog}: parameters from {params_file}; nodes: " + ", ".join(node_label(item) for item in plan)
          + ("; every robot's camera side in a process of its own" if robot_processes else ""), flush=True)
    agent, code = Agent(plan, params_file, robot_processes, background_niceness), 0
    try:
        agent.build()
        session.start(agent)
        agent.spin(executor, background_niceness)
        code = session.run(agent)
        if (failure := agent.failure()) is not None:  # a node died: the run failed, whatever the session says
            print(f"{prog}: {failure}", file=sys.stderr, flush=True)
            code = code or 1
    except (ParameterError, RobotProcessError) as exc:  # a robot's process that did not start: 1
        print(f"{prog}: {exc}", file=sys.stderr, flush=True)
        code = 2 if isinstance(exc, ParameterError) else 1
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        try:
            session.finish(agent)
        except KeyboardInterrupt:  # a second Ctrl-C: stop now
            pass
        agent.close()
    return code

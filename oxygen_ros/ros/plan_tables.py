"""The agent's nodes and launch arguments, as tables, and how an argument's text becomes a value.

:data:`NODES` (the nodes of the launch file and ``oxygen-agent``, in start
order), :data:`ARGUMENTS` (written ``name:=value``; an empty value keeps the
parameters file's), :data:`DEMO_PARAMETERS`, and :func:`argument_overrides`:
what the arguments set. :mod:`.plan` makes the plan from them, :mod:`.robot_plan`
the plan of several robots. No rclpy here: the launch file imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    Argument("tokenizer_path", "", "SentencePiece tokenizer.model (empty: the YAML's, by default the checkpoint's).",
             "oxygen_inference", "tokenizer_path"),
    Argument("norm_stats_path", "", "Normalisation statistics file (empty: the YAML's, by default the "
             "checkpoint's).", "oxygen_inference", "norm_stats_path"),
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
    Argument("respawn", "false", "true: a camera side's node that exits (camera node, synthetic camera) is "
             "restarted after respawn_delay, and the other robots run on; the inference node stays required."),
    Argument("respawn_delay", "", "Seconds before a camera side's node is restarted (respawn:=true; empty: "
             "1.0; at least 0.1)."),
    Argument("respawn_max_retries", "", "Most restarts of each camera side's node (oxygen-agent: of each robot's "
             "camera side process; respawn:=true; empty: no limit): its next exit ends the launch, as without "
             "respawn."),
)

RESPAWN_DELAY_S = 1.0  # respawn_delay left empty
# launch_ros decides to restart a node as it queues its exit, before the launch's handler can end the
# launch for a bad parameter: with no delay, it restarted such a node once, while the launch shut down
RESPAWN_MIN_DELAY_S = 0.1

#: With demo:=true, the camera node also takes the synthetic camera's gripper
#: position as the robot state (closing the loop the way the model was trained).
#: The synthetic camera's image side: the embedded default model's resolution.
DEMO_IMAGE_SIZE = 48
DEMO_PARAMETERS: dict[str, dict[str, Any]] = {
    # the synthetic camera renders images at the embedded model's resolution: pass
    # them on at that size instead of upscaling them to the YAML's 224
    "oxygen_camera": {"state_topic": "joint_states", "image_size": DEMO_IMAGE_SIZE},
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


def node_label(item: dict[str, Any]) -> str:
    """How logs name a plan item's node: ``oxygen_camera``, or ``left/oxygen_camera`` in a robot's namespace."""
    return f"{item['namespace']}/{item['spec'].name}" if item["namespace"] else item["spec"].name


def node_fqn(item: dict[str, Any]) -> str:
    """A plan item's node's fully-qualified name: ``/oxygen_camera``, ``/left/oxygen_camera``."""
    return "/" + node_label(item)


def parse_bool(name: str, value: str) -> bool:
    v = str(value).strip().lower()
    if v in TRUE:
        return True
    if v in FALSE:
        return False
    raise ValueError(f"argument '{name}': expected true or false, got {value!r}")


def parse_respawn(args: dict[str, str]) -> float | None:
    """The seconds before a camera side's node is restarted, None when it is not (``respawn``
    false); ValueError naming the argument for a bad value, and for a ``respawn_delay``
    given without ``respawn:=true`` (it would silently restart nothing)."""
    delay = args["respawn_delay"].strip()
    if not parse_bool("respawn", args["respawn"]):
        if delay:
            raise ValueError(f"argument 'respawn_delay': {delay!r} restarts nothing without respawn:=true")
        return None
    if not delay:
        return RESPAWN_DELAY_S
    try:
        value = float(delay)
    except ValueError:
        value = float("nan")
    if not RESPAWN_MIN_DELAY_S <= value < float("inf"):
        raise ValueError(f"argument 'respawn_delay': expected seconds >= {RESPAWN_MIN_DELAY_S:g}, got {delay!r}")
    return value


def parse_respawn_retries(args: dict[str, str]) -> int | None:
    """The most restarts of one camera side's node, None for no limit (``respawn_max_retries``
    empty); ValueError naming the argument for a value that is no whole number >= 1, and for
    one given without ``respawn:=true``. Call after :func:`parse_respawn`."""
    text = args["respawn_max_retries"].strip()
    if not text:
        return None
    if not parse_bool("respawn", args["respawn"]):
        raise ValueError(f"argument 'respawn_max_retries': {text!r} limits nothing without respawn:=true")
    if not text.isdecimal() or int(text) < 1:  # (isdigit would pass '²', which int refuses)
        raise ValueError(f"argument 'respawn_max_retries': expected a whole number >= 1 (empty: no limit), "
                         f"got {text!r}")
    return int(text)


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

"""The camera node's parameters (:data:`PARAMETERS`) and the camera names they give.

One :class:`~oxygen_ros.ros.parameters.ParamSpec` per parameter, the same checks at
start and at run time; ``config/agent.yaml`` lists them with their defaults.
"""

from __future__ import annotations

from typing import Any

from oxygen_ros.ros.conversions import DEFAULT_MAX_IMAGE_BYTES
from oxygen_ros.ros.parameters import (
    ParameterError,
    ParamSpec,
    at_least_one,
    non_negative,
    one_of,
    optional_topic_name,
    positive,
    topic_list,
    topic_name,
)
from oxygen_ros.ros.qos import RELIABILITY


def _joint_names(value: list, values=None) -> str | None:
    if not all(value) or len(set(value)) != len(value):
        return f"names must be unique and non-empty, got {value}"
    return None


def _image_size(value: int, values=None) -> str | None:
    return None if 1 <= value <= 4096 else f"must be between 1 and 4096 pixels, got {value}"


PARAMETERS: tuple[ParamSpec, ...] = (
    ParamSpec("image_topics", ["camera/image_raw"], "sensor_msgs/Image camera topics", "str_list", topic_list),
    ParamSpec("compressed_image_topics", [], "sensor_msgs/CompressedImage (JPEG/PNG) camera topics",
              "str_list", topic_list),
    ParamSpec("camera_names", [], "camera names, one per topic (image_topics then compressed_image_topics); "
              "empty: base, cam1, cam2, ...", "str_list"),
    ParamSpec("camera_order", [], "camera_names in the order of the model's camera slots, each once (a JPEG "
              "base camera before a raw wrist camera); empty: the topics' order", "str_list"),
    ParamSpec("instruction_topic", "oxygen/instruction", "std_msgs/String task instruction (latched)",
              "str", topic_name),
    ParamSpec("instruction_wait_s", 2.0, "seconds the first group waits for the instruction while a publisher "
              "is on instruction_topic and none has come (a latched one comes once its publisher is discovered, "
              "often after the first frames); then default_instruction; 0: never wait", "float", non_negative),
    ParamSpec("state_topic", "", "sensor_msgs/JointState whose position is the robot state; empty: no state",
              "str", optional_topic_name),
    ParamSpec("state_joint_names", [], "joints whose positions make the state, in this order, picked by name "
              "from the JointState messages (several publishers on state_topic, an arm and a gripper, each "
              "give theirs; other joints are ignored); empty: each message's positions in the order of the first "
              "message's joint names (the same joints in another order are put back in it, others refused)",
              "str_list", _joint_names, constraints="names, each once"),
    ParamSpec("state_wait", True, "a group waits for the state due next when that one is closer in time to its "
              "images than the state held and due within half a frame period (a driver that sends each image, "
              "then the state taken with it); false: the state held when the group is complete", "bool"),
    ParamSpec("max_state_age", 1.0, "seconds: a state older than this (by arrival; with state_joint_names, "
              "its oldest joint) is no state, and no group goes out until a newer one; 0: no limit",
              "float", non_negative, dynamic=True),
    ParamSpec("observation_topic", "oxygen/observation", "oxygen_ros/Observation output topic", "str", topic_name),
    ParamSpec("image_size", 224, "side in pixels of the square images sent (the model's resolution)",
              "int", _image_size, dynamic=True, constraints="1..4096"),
    ParamSpec("max_age", 0.5, "seconds: a group whose oldest image is older than this is dropped",
              "float", positive, dynamic=True),
    ParamSpec("max_image_bytes", DEFAULT_MAX_IMAGE_BYTES, "largest accepted image in bytes "
              "(message data and decoded RGB)", "int", positive, dynamic=True),
    ParamSpec("default_instruction", "", "instruction used until one arrives on instruction_topic, and after "
              "an empty one (empty: an empty instruction clears the task, and no observation goes out until one "
              "comes)",
              "str", dynamic=True),
    ParamSpec("image_reliability", "best_effort", "QoS reliability of every image subscription: best_effort "
              "(matches every publisher; large raw images may lose fragments) | reliable (nothing lost, "
              "matches reliable publishers only); one camera: qos_overrides.<topic>.subscription.reliability",
              "str", one_of(RELIABILITY), constraints=" | ".join(RELIABILITY)),
    ParamSpec("image_qos_depth", 5, "QoS history depth of every image subscription; one camera: "
              "qos_overrides.<topic>.subscription.depth", "int", at_least_one),
    ParamSpec("min_camera_rate_hz", 5.0, "frames per second below which a camera is warned about (console and "
              "/diagnostics), measured over 3 s; 0: never", "float", non_negative, dynamic=True),
)


def default_camera_names(count: int) -> list[str]:
    """``base``, ``cam1``, ``cam2``, ... for ``count`` cameras."""
    return ["base"] + [f"cam{i}" for i in range(1, count)] if count else []


def camera_names(p: dict[str, Any]) -> list[str]:
    """The camera names for the topics (checked), or ParameterError."""
    raw, compressed = p["image_topics"], p["compressed_image_topics"]
    topics = raw + compressed
    if not topics:
        raise ParameterError("image_topics", "no camera topics: image_topics and compressed_image_topics "
                             "are both empty")
    if set(raw) & set(compressed):
        raise ParameterError("compressed_image_topics", "a topic is also listed in image_topics")
    names = p["camera_names"] or default_camera_names(len(topics))
    if len(names) != len(topics):
        raise ParameterError("camera_names", f"{len(names)} names for {len(topics)} camera topics {topics}")
    if not all(names) or len(set(names)) != len(names):
        raise ParameterError("camera_names", f"names must be unique and non-empty, got {names}")
    return names


def slot_order(p: dict[str, Any], names: list[str]) -> list[int]:
    """The cameras (indices into ``names``) in the order of the model's slots: ``camera_order``,
    or the topics' order; ParameterError unless ``camera_order`` lists every name once."""
    order = p["camera_order"]
    if not order:
        return list(range(len(names)))
    if sorted(order) != sorted(names):
        raise ParameterError("camera_order", f"must list every camera name once, {names} in the slots' order, "
                             f"got {order}")
    return [names.index(name) for name in order]

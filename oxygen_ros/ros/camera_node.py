"""Camera node: groups the newest frame of every camera into Observation messages.

``oxygen_camera`` subscribes to raw (``sensor_msgs/Image``) and compressed
(``sensor_msgs/CompressedImage``) camera topics, the task instruction
(``std_msgs/String``, latched) and optionally the robot state
(``sensor_msgs/JointState``), and publishes ``oxygen_ros/Observation``:

* it keeps the newest good frame of every camera; once every camera has
  delivered a frame newer than the last published group (a frame with the
  stamp of the one already grouped does not count) it publishes one
  Observation (``seq`` 0, 1, 2, ...), images resized to ``image_size`` (aspect
  kept, black padding), header stamp = capture time of the oldest image;
* a group whose oldest image is older than ``max_age`` (node clock) is dropped
  with a throttled warning; the stale cameras must deliver a newer frame;
* a bad image (see :class:`~oxygen_ros.ros.conversions.ImageError`) is counted
  in ``rejected[reason]`` and logged (throttled, naming topic and reason); the
  node keeps the camera's previous frame and uses the next good one;
* control characters are stripped from the instruction (with a warning); until
  an instruction arrives, and after an empty one, ``default_instruction`` is
  used (an over-long one is cut to the model's prompt length by the inference
  node);
* a state with NaN/inf (or empty, or too long, or whose ``name`` and
  ``position`` lengths disagree) is rejected and never forwarded; with
  ``state_topic`` set, no group is published without a valid state, and frames
  held back for want of one go out when a valid state arrives (the decision is
  :class:`~oxygen_ros.core.grouping.FrameGrouping`'s);
* once a second it publishes a ``diagnostic_msgs/DiagnosticArray`` on
  ``/diagnostics`` (status ``oxygen_camera: cameras``): every rejection counter
  (``rejected_<reason>``), groups published and dropped stale, frames received
  and the age of the newest frame per camera; WARN when something was rejected
  or dropped since the last status or a camera is silent for longer than
  ``max_age``.

Parameters are listed in :data:`PARAMETERS`; topics and camera names are read
at start (read-only), the others can be changed at run time and are validated.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Header, String

from oxygen_ros.core.grouping import NO_STATE, PUBLISH, STALE, Decision, FrameGrouping
from oxygen_ros.core.text import clean_text
from oxygen_ros.core.throttle import Throttle
from oxygen_ros.msg import Observation as ObservationMsg
from oxygen_ros.ros.conversions import (
    DEFAULT_MAX_IMAGE_BYTES,
    IMAGE_ERROR_REASONS,
    ImageError,
    compressed_msg_to_rgb,
    core_observation,
    image_msg_to_rgb,
    ns_to_time_msg,
    observation_to_msg,
    stamp_to_ns,
    to_model_image,
)
from oxygen_ros.ros.node_main import run_node
from oxygen_ros.ros.parameters import (
    ParameterError,
    ParamSpec,
    changed_values,
    declare_parameters,
    optional_topic_name,
    parameter_callback,
    positive,
    topic_list,
    topic_name,
)
from oxygen_ros.ros.qos import LATCHED_QOS, OBSERVATION_QOS

NODE_NAME = "oxygen_camera"

#: Reasons (besides IMAGE_ERROR_REASONS) counted in ``CameraNode.rejected``.
STATE_REJECTION_REASONS = ("state_not_finite", "state_empty", "state_too_long", "state_names_mismatch")
#: Seconds between two DiagnosticArray messages on /diagnostics.
DIAGNOSTICS_PERIOD_S = 1.0


# --------------------------------------------------------------------------
# The node
# --------------------------------------------------------------------------


def _image_size(value: int, values=None) -> str | None:
    return None if 1 <= value <= 4096 else f"must be between 1 and 4096 pixels, got {value}"


PARAMETERS: tuple[ParamSpec, ...] = (
    ParamSpec("image_topics", ["/camera/image_raw"], "sensor_msgs/Image camera topics", "str_list", topic_list),
    ParamSpec("compressed_image_topics", [], "sensor_msgs/CompressedImage (JPEG/PNG) camera topics",
              "str_list", topic_list),
    ParamSpec("camera_names", [], "camera names, one per topic (image_topics then compressed_image_topics); "
              "empty: base, cam1, cam2, ...", "str_list"),
    ParamSpec("instruction_topic", "/oxygen/instruction", "std_msgs/String task instruction (latched)",
              "str", topic_name),
    ParamSpec("state_topic", "", "sensor_msgs/JointState whose position is the robot state; empty: no state",
              "str", optional_topic_name),
    ParamSpec("observation_topic", "/oxygen/observation", "oxygen_ros/Observation output topic", "str", topic_name),
    ParamSpec("image_size", 224, "side in pixels of the square images sent (the model's resolution)",
              "int", _image_size, dynamic=True),
    ParamSpec("max_age", 0.5, "seconds: a group whose oldest image is older than this is dropped",
              "float", positive, dynamic=True),
    ParamSpec("max_image_bytes", DEFAULT_MAX_IMAGE_BYTES, "largest accepted image in bytes "
              "(message data and decoded RGB)", "int", positive, dynamic=True),
    ParamSpec("default_instruction", "", "instruction used until one arrives on instruction_topic, and after "
              "an empty one",
              "str", dynamic=True),
)


def default_camera_names(count: int) -> list[str]:
    """``base``, ``cam1``, ``cam2``, ... for ``count`` cameras."""
    return ["base"] + [f"cam{i}" for i in range(1, count)] if count else []


def _camera_names(p: dict[str, Any]) -> list[str]:
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


@dataclass
class _Frame:
    rgb: np.ndarray  # HxWx3 uint8, original size
    stamp_ns: int
    header: Header


class CameraNode(Node):
    """Groups camera frames, instruction and state into Observation messages."""

    def __init__(self, **kwargs: Any):
        super().__init__(NODE_NAME, **kwargs)
        self._core = core_observation()  # torch: imported now rather than at the first frame
        try:
            p = declare_parameters(self, PARAMETERS)
            names = _camera_names(p)
        except ParameterError as exc:
            self.get_logger().fatal(str(exc))
            self.destroy_node()
            raise
        self._raw_topics: list[str] = p["image_topics"]
        self._compressed_topics: list[str] = p["compressed_image_topics"]
        self.topics: list[str] = self._raw_topics + self._compressed_topics
        self.camera_names: list[str] = list(names)
        self.image_size: int = p["image_size"]
        self.max_age: float = p["max_age"]
        self.max_image_bytes: int = p["max_image_bytes"]
        self.default_instruction: str = clean_text(p["default_instruction"])
        self.state_topic: str = p["state_topic"]
        self._instruction_topic: str = p["instruction_topic"]

        # Counters (read by diagnostics and tests).
        self.rejected: dict[str, int] = {r: 0 for r in IMAGE_ERROR_REASONS + STATE_REJECTION_REASONS}
        self.published = 0
        self.dropped_stale = 0
        self.waiting_for_state = 0
        self.received = [0] * len(self.topics)  # good frames per camera
        self._last_frame_mono: list[float | None] = [None] * len(self.topics)
        self._diag_prev: dict[str, int] = {}

        self.seq = 0
        self.instruction: str | None = None
        self.state: np.ndarray | None = None
        self._frames: list[_Frame | None] = [None] * len(self.topics)
        self._grouping = FrameGrouping(len(self.topics), needs_state=bool(self.state_topic))  # when to publish
        self._throttle = Throttle(5.0)
        self._unstamped_warned: set[str] = set()

        self._subscribe(p)
        self.add_on_set_parameters_callback(parameter_callback(PARAMETERS))
        self.add_post_set_parameters_callback(self._apply_parameters)
        self._diag_publisher = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._diag_timer = self.create_timer(DIAGNOSTICS_PERIOD_S, self._publish_diagnostics)
        cams = ", ".join(f"{n}={t}" for n, t in zip(self.camera_names, self.topics))
        self.get_logger().info(
            f"grouping {len(self.topics)} camera(s) [{cams}] into {p['observation_topic']} at "
            f"{self.image_size}x{self.image_size}; instruction from {p['instruction_topic']}; "
            f"state from {self.state_topic or '(none)'}")

    def _subscribe(self, p: dict[str, Any]) -> None:
        self._publisher = self.create_publisher(ObservationMsg, p["observation_topic"], OBSERVATION_QOS)
        self._inputs = []
        for index, topic in enumerate(self.topics):
            msg_type = Image if index < len(self._raw_topics) else CompressedImage
            self._inputs.append(self.create_subscription(
                msg_type, topic, partial(self._on_image, index), qos_profile_sensor_data))
        self._inputs.append(self.create_subscription(
            String, p["instruction_topic"], self._on_instruction, LATCHED_QOS))
        if self.state_topic:
            self._inputs.append(self.create_subscription(
                JointState, self.state_topic, self._on_state, qos_profile_sensor_data))

    # -- parameters ---------------------------------------------------------

    def _apply_parameters(self, params: list) -> None:
        for name, value in changed_values(PARAMETERS, params).items():
            setattr(self, name, clean_text(value) if name == "default_instruction" else value)

    # -- inputs -------------------------------------------------------------

    def _warn(self, key: Any, text: str) -> None:
        suppressed = self._throttle(key)
        if suppressed is not None:
            more = f" ({suppressed} more since the last report)" if suppressed else ""
            self.get_logger().warning(text + more)

    def _on_image(self, index: int, msg: Image | CompressedImage) -> None:
        topic = self.topics[index]
        try:
            if isinstance(msg, CompressedImage):
                rgb = compressed_msg_to_rgb(msg, self.max_image_bytes)
            else:
                rgb = image_msg_to_rgb(msg, self.max_image_bytes)
        except ImageError as exc:
            self.rejected[exc.reason] = self.rejected.get(exc.reason, 0) + 1
            self._warn((topic, exc.reason), f"rejected image on {topic}: {exc}")
            return
        self.received[index] += 1
        self._last_frame_mono[index] = time.monotonic()
        stamp_ns = stamp_to_ns(msg.header.stamp)
        header = msg.header
        if stamp_ns == 0:
            stamp_ns = self.get_clock().now().nanoseconds
            header = Header(stamp=ns_to_time_msg(stamp_ns), frame_id=msg.header.frame_id)
            if topic not in self._unstamped_warned:
                self._unstamped_warned.add(topic)
                self.get_logger().warning(f"images on {topic} have no header stamp: using the receive time")
        self._frames[index] = _Frame(rgb, stamp_ns, header)
        self._act(self._grouping.frame_arrived(index, stamp_ns, self.get_clock().now().nanoseconds, self.max_age,
                                               self.state is not None))

    def _on_instruction(self, msg: String) -> None:
        text = clean_text(msg.data)
        if text != msg.data:
            self._warn("instruction_control", f"instruction had control characters, removed: "
                       f"{_clip(msg.data)!r} -> {_clip(text)!r}")
        if not text.strip():
            self._warn("instruction_empty", f"empty instruction on {self._instruction_topic}: using "
                       f"default_instruction {self.default_instruction!r}")
            self.instruction = None
            return
        if text != self.instruction:
            self.get_logger().info(f"instruction ({len(text)} characters): {_clip(text)!r}")
        self.instruction = text

    def _on_state(self, msg: JointState) -> None:
        state = np.asarray(msg.position, dtype=np.float64)
        if state.size == 0:
            reason, text = "state_empty", "JointState has no position values"
        elif len(msg.name) and len(msg.name) != state.size:
            reason, text = "state_names_mismatch", f"{len(msg.name)} joint names for {state.size} positions"
        elif state.size > self._core.MAX_STATE_DIM:
            reason, text = "state_too_long", f"{state.size} positions, at most {self._core.MAX_STATE_DIM} supported"
        elif not np.all(np.isfinite(state)):
            reason, text = "state_not_finite", f"positions contain NaN or infinite values: {state.tolist()}"
        else:
            self.state = state.astype(np.float32)
            self._act(self._grouping.state_arrived(self.get_clock().now().nanoseconds, self.max_age))
            return
        self.state = None  # never forward an older state as if it were current
        self.rejected[reason] += 1
        self._warn((self.state_topic, reason), f"rejected state on {self.state_topic}: {text}")

    # -- diagnostics --------------------------------------------------------

    def diagnostics(self) -> dict[str, Any]:
        """The figures published on /diagnostics, as a dict."""
        now = time.monotonic()
        out: dict[str, Any] = {f"rejected_{reason}": count for reason, count in self.rejected.items()}
        out.update(rejected_total=sum(self.rejected.values()), published=self.published,
                   dropped_stale=self.dropped_stale, waiting_for_state=self.waiting_for_state,
                   instruction=_clip(self.instruction if self.instruction is not None else self.default_instruction))
        for name, topic, count, last in zip(self.camera_names, self.topics, self.received, self._last_frame_mono):
            out[f"{name}.topic"] = topic
            out[f"{name}.frames"] = count
            out[f"{name}.last_frame_age_s"] = math.nan if last is None else now - last
        return out

    def diagnostic_status(self, d: dict[str, Any] | None = None) -> tuple[bytes, str]:
        """(level, message): WARN for rejections and stale groups since the last status,
        and for cameras silent for longer than ``max_age``; else OK."""
        d = self.diagnostics() if d is None else d
        problems = []
        new = {reason: count - self._diag_prev.get(reason, 0) for reason, count in self.rejected.items()}
        self._diag_prev.update(self.rejected)
        rejected = ", ".join(f"{n} {reason}" for reason, n in new.items() if n)
        if rejected:
            problems.append(f"rejected: {rejected}")
        stale = self.dropped_stale - self._diag_prev.get("_stale", 0)
        self._diag_prev["_stale"] = self.dropped_stale
        if stale:
            problems.append(f"{stale} stale groups dropped")
        silent = [f"{name} ({d[f'{name}.last_frame_age_s']:.1f} s)" if self.received[i] else f"{name} (no frame yet)"
                  for i, name in enumerate(self.camera_names)
                  if not self.received[i] or d[f"{name}.last_frame_age_s"] > self.max_age]
        if silent:
            problems.append("no frame from " + ", ".join(silent))
        level = DiagnosticStatus.WARN if problems else DiagnosticStatus.OK
        return level, "; ".join(problems) if problems else f"{self.published} observations published"

    def _publish_diagnostics(self) -> None:
        try:
            d = self.diagnostics()
            level, message = self.diagnostic_status(d)
            status = DiagnosticStatus(level=level, name=f"{self.get_name()}: cameras", message=message,
                                      hardware_id=",".join(self.topics))
            status.values = [KeyValue(key=k, value=(f"{v:.3f}" if isinstance(v, float) else str(v)))
                             for k, v in d.items()]
            array = DiagnosticArray(status=[status])
            array.header.stamp = self.get_clock().now().to_msg()
            self._diag_publisher.publish(array)
        except Exception as exc:  # diagnostics must never end the node
            self.get_logger().error(f"diagnostics failed: {exc!r}")

    # -- output -------------------------------------------------------------

    def _act(self, decision: Decision) -> None:
        """Carry out the grouping's decision (:mod:`oxygen_ros.core.grouping`)."""
        if decision.kind == STALE:
            self.dropped_stale += 1
            now_ns = self.get_clock().now().nanoseconds
            ages = ", ".join(f"{self.topics[i]} {(now_ns - self._frames[i].stamp_ns) / 1e9:.3f} s"
                             for i in decision.stale)
            self._warn("stale", f"dropped a stale group (max_age {self.max_age} s): {ages}")
        elif decision.kind == NO_STATE:
            self.waiting_for_state += 1
            self._warn("no_state", f"no valid state on {self.state_topic} yet: not publishing")
        elif decision.kind == PUBLISH:
            self._publish_group()

    def _publish_group(self) -> None:
        frames = [f for f in self._frames if f is not None]
        instruction = self.instruction if self.instruction is not None else self.default_instruction
        oldest = min(f.stamp_ns for f in frames)
        observation = self._core.Observation(
            images={name: to_model_image(f.rgb, self.image_size) for name, f in zip(self.camera_names, frames)},
            instruction=instruction,
            state=self.state,
            stamp=oldest / 1e9,
        )
        msg = observation_to_msg(
            observation,
            self.seq,
            stamp=ns_to_time_msg(oldest),
            image_headers={name: f.header for name, f in zip(self.camera_names, frames)},
        )
        self._publisher.publish(msg)
        self.seq += 1
        self.published += 1
        self._grouping.published()


def _clip(text: str, limit: int = 200) -> str:
    """``text`` for a log line: at most ``limit`` characters (and how many more)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


def main(args: list[str] | None = None) -> int:
    return run_node(CameraNode, args)


if __name__ == "__main__":
    raise SystemExit(main())

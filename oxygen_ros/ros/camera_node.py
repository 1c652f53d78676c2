"""Camera node: groups the newest frame of every camera into Observation messages.

``oxygen_camera`` subscribes to raw (``sensor_msgs/Image``) and compressed
(``sensor_msgs/CompressedImage``) camera topics, the task instruction (``std_msgs/String``,
latched) and optionally the robot state (``sensor_msgs/JointState``), and publishes
``oxygen_ros/Observation``:

* it keeps the newest good frame of every camera; once every camera has delivered a frame newer
  than the last published group (a frame with the stamp of the one already grouped does not
  count) it publishes one Observation (``seq`` 0, 1, 2, ...), images resized to ``image_size``
  (aspect kept, black padding), header stamp = capture time of the oldest image;
* a group whose oldest image is older than ``max_age`` (node clock) is dropped with a throttled
  warning; the stale cameras must deliver a newer frame;
* a bad image (see :class:`~oxygen_ros.ros.conversions.ImageError`) is counted in
  ``rejected[reason]`` and logged (throttled, naming topic and reason); the node keeps the
  camera's previous frame and uses the next good one;
* control characters are stripped from the instruction (with a warning); until an instruction
  arrives, and after an empty one, ``default_instruction`` is used (with that empty, an empty one
  clears the task: no group goes out until one comes; an over-long one is cut to the model's
  prompt length by the inference node); the first group waits up to
  ``instruction_wait_s`` for an instruction while a publisher is on its topic
  (:mod:`.camera_instruction`);
* a state with NaN/inf (or empty, or too long, or whose ``name`` and ``position`` lengths
  disagree, or other joints than the first message's: :mod:`~oxygen_ros.core.joint_state`) is
  rejected and never forwarded; with ``state_topic`` set, no group is published
  without a valid state, and frames held back for want of one, or for the state of their moment,
  go out when it arrives (the decision is :class:`~oxygen_ros.core.grouping.FrameGrouping`'s);
* images are subscribed with ``image_reliability`` and ``image_qos_depth`` (one camera: ROS 2's
  own ``qos_overrides.<topic>.subscription.reliability|depth``); a publisher whose QoS cannot
  match is named in a warning;
* once a second it publishes a ``diagnostic_msgs/DiagnosticArray`` on ``/diagnostics`` (status
  ``oxygen_camera: cameras``, in a robot's namespace ``left/oxygen_camera: cameras``): the
  figures and levels of :mod:`.camera_status`; a slow camera is also warned on the console
  (throttled, with a hint when a reliable publisher meets a best-effort subscription). Logs name
  the resolved (remapped) topics.

Parameters are listed in :data:`PARAMETERS`: topics, camera names, QoS and ``instruction_wait_s``
read at start (read-only), the others changed at run time, validated."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from rclpy.qos_overriding_options import QoSOverridingOptions, QoSPolicyKind
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Header

from oxygen_ros.core.grouping import NO_STATE, PUBLISH, STALE, WAIT, Decision, FrameGrouping
from oxygen_ros.core.joint_state import StateTracker
from oxygen_ros.core.text import clean_text, clip
from oxygen_ros.core.throttle import Throttle
from oxygen_ros.msg import Observation as ObservationMsg
from oxygen_ros.ros.camera_instruction import CameraInstruction
from oxygen_ros.ros.camera_parameters import PARAMETERS, camera_names, slot_order
from oxygen_ros.ros.camera_status import NO_PUBLISHER, CameraStatus, publishers_hint, stale_group_text
from oxygen_ros.ros.conversions import (IMAGE_ERROR_REASONS, ImageError, compressed_msg_to_rgb, core_observation,
                                        image_msg_to_rgb, ns_to_time_msg, observation_to_msg, stamp_to_ns,
                                        to_model_image)
from oxygen_ros.ros.diagnostic_message import diagnostic_array
from oxygen_ros.ros.node_help import NodeHelp
from oxygen_ros.ros.node_main import run_node
from oxygen_ros.ros.one_shot import OneShot
from oxygen_ros.ros.params_files import NodeStart, node_start, warn_unused_qos_overrides
from oxygen_ros.ros.parameter_changes import changed_values, check_parameter_changes, log_changes
from oxygen_ros.ros.parameters import ParameterError, declare_parameters
from oxygen_ros.ros.qos import OBSERVATION_QOS, image_qos, is_reliable

NODE_NAME = "oxygen_camera"

#: Reasons (besides IMAGE_ERROR_REASONS) counted in ``CameraNode.rejected``.
STATE_REJECTION_REASONS = ("state_not_finite", "state_empty", "state_too_long", "state_names_mismatch",
                           "state_names_changed")
#: Seconds between two DiagnosticArray messages on /diagnostics.
DIAGNOSTICS_PERIOD_S = 1.0


@dataclass
class _Frame:
    rgb: np.ndarray  # HxWx3 uint8, original size
    stamp_ns: int
    header: Header
    arrival_ns: int


class CameraNode(Node):
    """Groups camera frames, instruction and state into Observation messages."""

    def __init__(self, **kwargs: Any):
        super().__init__(NODE_NAME, **kwargs)
        self._core = core_observation()  # torch: imported now rather than at the first frame
        try:
            p = declare_parameters(self, PARAMETERS, start=(start := node_start(NODE_NAME, kwargs)))
            names = camera_names(p)
            self._slots = slot_order(p, names)  # the cameras in the model's slot order
            if len(p["state_joint_names"]) > self._core.MAX_STATE_DIM:
                raise ParameterError("state_joint_names", f"{len(p['state_joint_names'])} joints, at most "
                                     f"{self._core.MAX_STATE_DIM} supported")
        except ParameterError as exc:
            self.get_logger().fatal(str(exc))
            self.destroy_node()
            raise
        self._raw_topics: list[str] = p["image_topics"]
        self._compressed_topics: list[str] = p["compressed_image_topics"]
        self.topics: list[str] = self._raw_topics + self._compressed_topics  # resolved once subscribed
        self.camera_names: list[str] = list(names)
        self.min_camera_rate_hz: float = p["min_camera_rate_hz"]
        self.image_size: int = p["image_size"]
        self.max_age: float = p["max_age"]
        self.max_image_bytes: int = p["max_image_bytes"]
        self.default_instruction: str = clean_text(p["default_instruction"])
        self.state_topic: str = p["state_topic"]
        self.max_state_age: float = p["max_state_age"]
        self.seq = 0
        self._state = StateTracker(p["state_joint_names"], self._core.MAX_STATE_DIM)  # see core/joint_state.py
        self._frames: list[_Frame | None] = [None] * len(self.topics)
        self._image_bytes: list[int | None] = [None] * len(self.topics)  # each camera's last message's data size
        self._grouping = FrameGrouping(len(self.topics), bool(self.state_topic), p["state_wait"])  # when to publish
        self._retry = OneShot(self, self._decide_again)  # a waiting or held group is decided again then
        self._throttle = Throttle(5.0)
        self._told: set[tuple[str, str]] = set()  # (what, topic) told once in the log
        self._stopped = False  # after shutdown(): frames are no longer grouped

        self._subscribe(p, start)
        # counters and figures (diagnostics, console, tests), on the resolved topic names
        self.status = CameraStatus(self.camera_names, self.topics, IMAGE_ERROR_REASONS + STATE_REJECTION_REASONS,
                                   reading_period=DIAGNOSTICS_PERIOD_S)
        check_parameter_changes(self, PARAMETERS)
        self.add_post_set_parameters_callback(self._apply_parameters)
        self._diag_publisher = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._diag_timer = self.create_timer(DIAGNOSTICS_PERIOD_S, self._publish_diagnostics)
        cams = ", ".join(f"{n}={t} ({'reliable' if is_reliable(s.qos_profile) else 'best effort'}, depth "
                         f"{s.qos_profile.depth})" for n, t, s in zip(self.camera_names, self.topics, self._images))
        self.get_logger().info(
            f"grouping {len(self.topics)} camera(s) [{cams}] into {self._publisher.topic_name} at "
            f"{self.image_size}x{self.image_size}; instruction from {self._instruction.topic}; "
            f"state from {self.state_topic or '(none)'}")

    def _subscribe(self, p: dict[str, Any], start: NodeStart) -> None:
        self._publisher = self.create_publisher(ObservationMsg, p["observation_topic"], OBSERVATION_QOS)
        per_topic = QoSOverridingOptions(policy_kinds=(QoSPolicyKind.RELIABILITY, QoSPolicyKind.DEPTH))
        self._images = []
        for index, topic in enumerate(self.topics):
            msg_type = Image if index < len(self._raw_topics) else CompressedImage
            qos = image_qos(p["image_reliability"], p["image_qos_depth"])  # one each: overrides change it in place
            self._images.append(self.create_subscription(
                msg_type, topic, partial(self._on_image, index), qos, qos_overriding_options=per_topic,
                event_callbacks=SubscriptionEventCallbacks(incompatible_qos=partial(self._on_incompatible, index))))
        self.topics = [s.topic_name for s in self._images]  # as remapped: what the logs and diagnostics name
        warn_unused_qos_overrides(self, self.topics, start)
        self._inputs = list(self._images)
        self._instruction = CameraInstruction(self, p["instruction_topic"], p["instruction_wait_s"],
                                              lambda: self.default_instruction, self._warn, self._decide_again)
        if self.state_topic:
            self._inputs.append(self.create_subscription(
                JointState, self.state_topic, self._on_state, qos_profile_sensor_data))
            self.state_topic = self._inputs[-1].topic_name

    def _on_incompatible(self, index: int, event) -> None:
        policy = event.last_policy_kind.name.lower().removeprefix("rmw_qos_policy_")
        mine = "reliable" if is_reliable(self._images[index].qos_profile) else "best effort"
        self._warn(("incompatible", index), f"a publisher on {self.topics[index]} cannot reach this node: its QoS "
                   f"is incompatible ({policy}) with this subscription's ({mine}); image_reliability: best_effort "
                   "matches every publisher")

    def _rate_hint(self, index: int) -> str:
        """What may help camera ``index``, slow or missing frames (:func:`~.camera_status.publishers_hint`)."""
        topic = self.topics[index]
        return publishers_hint(topic, self.get_publishers_info_by_topic(topic), self._images[index].qos_profile,
                               self._image_bytes[index], self.status.silent_for(index), self.status.received[index])

    @property  # the counters (see CameraStatus)
    def rejected(self) -> dict[str, int]:
        return self.status.rejected

    @property
    def received(self) -> list[int]:
        return self.status.received

    @property
    def published(self) -> int:
        return self.status.published

    @property
    def dropped_stale(self) -> int:
        return self.status.dropped_stale

    @property
    def waiting_for_state(self) -> int:
        return self.status.waiting_for_state

    @property
    def instruction(self) -> str | None:
        """The instruction received (None: none yet, or an empty one: groups carry default_instruction)."""
        return self._instruction.text

    # -- parameters ---------------------------------------------------------

    def _apply_parameters(self, params: list) -> None:
        changes = changed_values(PARAMETERS, params)
        before = {name: getattr(self, name, None) for name in changes}
        for name, value in changes.items():
            setattr(self, name, clean_text(value) if name == "default_instruction" else value)
        log_changes(self, changes, before=before)

    # -- inputs -------------------------------------------------------------

    def _warn(self, key: Any, text: str, *, info: bool = False) -> None:
        """Log ``text`` at most every 5 s per ``key`` (a warning; ``info``: an info line)."""
        suppressed = self._throttle(key)
        if suppressed is not None:
            more = f" ({suppressed} more since the last report)" if suppressed else ""
            if info:  # two call sites: rclpy refuses one site logging at two severities
                self.get_logger().info(text + more)
            else:
                self.get_logger().warning(text + more)

    def _first(self, key: tuple[str, str]) -> bool:
        """True the first time only, per ``key``: for what the log tells once."""
        first = key not in self._told
        self._told.add(key)
        return first

    def shutdown(self) -> None:
        """Stop grouping and checking the cameras, before the nodes downstream stop (``oxygen-agent``'s
        end): frames that queue while they stop are not grouped nor told as stale or late."""
        self._stopped = True
        self._retry.cancel()
        self._diag_timer.cancel()

    def _on_image(self, index: int, msg: Image | CompressedImage) -> None:
        if self._stopped:
            return
        topic = self.topics[index]
        self._image_bytes[index] = len(msg.data)
        try:
            if isinstance(msg, CompressedImage):
                rgb = compressed_msg_to_rgb(msg, self.max_image_bytes)
            else:
                rgb = image_msg_to_rgb(msg, self.max_image_bytes)
        except ImageError as exc:
            self.status.reject(exc.reason)
            self._warn((topic, exc.reason), f"rejected image on {topic}: {exc}")
            return
        if isinstance(msg, Image) and msg.encoding == "mono8" and self._first(("mono8", topic)):
            self.get_logger().info(f"images on {topic} are mono8 (grey): the model gets each as 3 equal channels")
        now_ns = self.get_clock().now().nanoseconds
        stamp_ns = stamp_to_ns(msg.header.stamp)
        header = msg.header
        if stamp_ns == 0:
            stamp_ns = now_ns
            header = Header(stamp=ns_to_time_msg(stamp_ns), frame_id=msg.header.frame_id)
            if self._first(("unstamped", topic)):
                self.get_logger().warning(f"images on {topic} have no header stamp: using the receive time")
        self.status.frame(index, stamp_ns, self._grouping.typical_period_ns(index))
        self._frames[index] = _Frame(rgb, stamp_ns, header, now_ns)
        state = self._state_at(now_ns)  # read once: the decision and the group it publishes see the same state
        self._act(self._grouping.frame_arrived(index, stamp_ns, now_ns, self.max_age, state is not None),
                  now_ns, state)

    @property
    def state(self) -> np.ndarray | None:
        """The state the next group gets now (None: none valid, a named joint missing, or too old)."""
        return self._state_at(self.get_clock().now().nanoseconds)

    def _state_at(self, now_ns: int) -> np.ndarray | None:
        return self._state.current(now_ns, self._state_age_limit())

    def _state_age_limit(self) -> float:
        return self.max_state_age if self.max_state_age > 0 else float("inf")

    def _on_state(self, msg: JointState) -> None:
        now_ns = self.get_clock().now().nanoseconds
        ordered = self._state.order
        refusal = self._state.update(list(msg.name), msg.position, now_ns,  # a refusal drops the state held
                                     stamp_to_ns(msg.header.stamp))
        if ordered is None and self._state.order is not None:
            self.get_logger().info(f"state from {self.state_topic}: joints {list(self._state.order)}, in the first "
                                   "message's order, kept for every message (state_joint_names picks them by name)")
        if refusal is None:
            state = self._state_at(now_ns)
            if state is not None:
                self._act(self._grouping.state_arrived(now_ns, self.max_age, self._state.stamp_ns), now_ns, state)
            return
        reason, text = refusal
        self.status.reject(reason)
        self._warn((self.state_topic, reason), f"rejected state on {self.state_topic}: {text}")

    # -- diagnostics --------------------------------------------------------

    def diagnostics(self) -> dict[str, Any]:
        """The figures published on /diagnostics, as a dict (see :class:`.camera_status.CameraStatus`)."""
        return self.status.figures(clip(self._instruction.current()))

    def diagnostic_status(self, d: dict[str, Any] | None = None) -> tuple[bytes, str]:
        """(level, message) of the status published now."""
        return self.status.status(self.diagnostics() if d is None else d, self.max_age, self.min_camera_rate_hz)

    def _publish_diagnostics(self) -> None:
        try:
            d = self.diagnostics()
            # named with the namespace: every robot's camera node has its own status (left/oxygen_camera)
            self._diag_publisher.publish(diagnostic_array(
                f"{self.get_fully_qualified_name().lstrip('/')}: cameras", ",".join(self.topics),
                self.diagnostic_status(d), d, self.get_clock().now().to_msg()))
            for line in self.status.rate_warnings(self.min_camera_rate_hz, self._rate_hint):
                self.get_logger().warning(line)
        except Exception as exc:  # diagnostics must never end the node
            self.get_logger().error(f"diagnostics failed: {exc!r}")

    # -- output -------------------------------------------------------------

    def _act(self, decision: Decision, now_ns: int, state: np.ndarray | None) -> None:
        """Carry out the grouping's decision (:mod:`oxygen_ros.core.grouping`), taken at
        ``now_ns`` with ``state`` (the state held then, None: no valid one)."""
        if self._stopped:  # (a state or a retry after shutdown)
            return
        if decision.kind == STALE:
            self.status.dropped_stale += 1
            text = stale_group_text(self.max_age, [(self.topics[i], now_ns - self._frames[i].stamp_ns,
                                                    now_ns - self._frames[i].arrival_ns) for i in decision.stale])
            if self.status.settling():  # just started: the cameras' publishers come up one after another
                self._warn("settling_stale", text, info=True)
            else:
                self._warn("stale", text)
        elif decision.kind == NO_STATE:
            self.status.waiting_for_state += 1
            why = self._state.missing(now_ns, self._state_age_limit())
            if not self.count_publishers(self.state_topic):  # (not found: a name or a namespace, or no driver)
                why = NO_PUBLISHER
            self.status.state_problem = f"no valid state on {self.state_topic}{f' ({why})' if why else ' yet'}"
            if self.status.settling():  # just started: the state's publisher may come up after the cameras'
                self._warn("settling_no_state", f"waiting for a valid state on {self.state_topic}"
                           f"{f' ({why})' if why else ''}: not publishing until one arrives", info=True)
            else:
                self._warn("no_state", f"no valid state on {self.state_topic}{f' ({why})' if why else ' yet'}: "
                                       "not publishing")
        elif decision.kind == PUBLISH:
            self._publish_or_hold(now_ns, state)
        elif decision.kind == WAIT and decision.retry_ns is not None:
            self._retry.at(decision.retry_ns, now_ns)

    def _decide_again(self) -> None:
        """The grouping decides again with nothing new (a held group's instruction came, or its wait ran
        out: for a frame or a newer state, it goes with those held; for the instruction, with the default)."""
        now_ns = self.get_clock().now().nanoseconds
        state = self._state_at(now_ns)
        self._act(self._grouping.again(now_ns, self.max_age, state is not None), now_ns, state)

    def _publish_or_hold(self, now_ns: int, state: np.ndarray | None) -> None:
        """Publish the group, unless the task was cleared, or it is the first and an instruction may come."""
        if self._instruction.task_cleared():  # (said when it came)
            self.status.waiting_for_instruction += 1
        elif self._instruction.hold(now_ns):
            self.status.waiting_for_instruction += 1
            self._retry.at(self._instruction.wait.deadline_ns, now_ns)
        else:
            self._publish_group(state)

    def _publish_group(self, state: np.ndarray | None) -> None:
        named = [(self.camera_names[i], self._frames[i]) for i in self._slots]  # every camera has a frame now
        instruction = self._instruction.current()
        oldest = min(f.stamp_ns for _, f in named)
        observation = self._core.Observation(
            images={name: to_model_image(f.rgb, self.image_size) for name, f in named},
            instruction=instruction,
            state=state if self.state_topic else None,
            stamp=oldest / 1e9,
        )
        msg = observation_to_msg(
            observation,
            self.seq,
            stamp=ns_to_time_msg(oldest),
            image_headers={name: f.header for name, f in named},
        )
        self._publisher.publish(msg)
        self.seq += 1
        self.status.group(self._grouping.spread_ns())
        self._grouping.published()
        self._retry.cancel()


ABOUT = NodeHelp("camera_node", "oxygen_camera", (
    "groups the newest frame of every camera (image_topics, compressed_image_topics), the instruction "
    "(instruction_topic) and the robot state (state_topic) into one Observation (observation_topic) for "
    "the inference node, images resized to image_size; its status on /diagnostics."), PARAMETERS)


def main(args: list[str] | None = None) -> int:
    return run_node(CameraNode, args, about=ABOUT)


if __name__ == "__main__":
    raise SystemExit(main())

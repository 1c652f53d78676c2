"""Input sources without a robot: a synthetic closed-loop camera and a rosbag2 player.

``oxygen_synthetic_camera`` (:class:`SyntheticCamera`, ``synthetic_camera_main``)
    Renders the 2-D reach task of :mod:`oxygen_ros.core.sim.scene` as an rgb8
    ``sensor_msgs/Image``, publishes the instruction (latched) and the gripper
    position as ``sensor_msgs/JointState`` (``gripper_x``, ``gripper_y``), and
    applies the first action (first two values, a displacement) of every
    ``ActionChunk`` it receives to the simulated gripper, so the demo is
    closed-loop. When the gripper reaches the target, or every
    ``retarget_every_s``, the target moves.

``oxygen_bag_player`` (:class:`BagPlayer`, ``bag_player_main``)
    Replays a rosbag2 bag (MCAP or SQLite3, detected from the bag) on the
    recorded topics with the recorded types and timing (scaled by ``rate``),
    optionally in lockstep with the model (an image is held until an
    ActionChunk for a newer observation arrived), optionally looping.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np
from rclpy.node import Node
from rclpy.serialization import deserialize_message
from rclpy.task import Future
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Header, String

from oxygen_ros.core.sim import scene as sim_scene
from oxygen_ros.core.throttle import Throttle
from oxygen_ros.msg import ActionChunk
from oxygen_ros.ros.bags import BagError, bag_topics, message_class, open_bag
from oxygen_ros.ros.conversions import action_chunk_array, ns_to_time_msg, rgb_to_image_msg, stamp_to_ns
from oxygen_ros.ros.parameters import (
    ParameterError,
    ParamSpec,
    changed_values,
    declare_parameters,
    non_negative,
    parameter_callback,
    positive,
    topic_list,
    topic_name,
)
from oxygen_ros.ros.node_main import run_node
from oxygen_ros.ros.qos import ACTIONS_QOS, DATA_QOS, LATCHED_QOS

IMAGE_TYPES = ("sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage")
JOINT_NAMES = ["gripper_x", "gripper_y"]


def _declare_or_log(node: Node, specs) -> dict[str, Any]:
    try:
        return declare_parameters(node, specs)
    except ParameterError as exc:
        node.get_logger().fatal(str(exc))
        node.destroy_node()
        raise


# --------------------------------------------------------------------------
# Synthetic camera
# --------------------------------------------------------------------------


def _sim_image_size(value: int, values=None) -> str | None:
    return None if 8 <= value <= 1024 else f"must be between 8 and 1024 pixels, got {value}"


SYNTHETIC_CAMERA_PARAMETERS: tuple[ParamSpec, ...] = (
    ParamSpec("rate_hz", 10.0, "frames per second", "float", positive, dynamic=True),
    ParamSpec("image_size", 32, "side in pixels of the square rendered image", "int", _sim_image_size, dynamic=True),
    ParamSpec("seed", 0, "random seed of the scene and of the target moves", "int"),
    ParamSpec("retarget_every_s", 8.0, "seconds between target moves (also moved when reached); 0: only when reached",
              "float", non_negative, dynamic=True),
    ParamSpec("max_step", sim_scene.MAX_STEP, "largest gripper displacement applied per action (norm, scene units)",
              "float", positive, dynamic=True),
    ParamSpec("frame_id", "camera", "header.frame_id of the images", "str", dynamic=True),
    ParamSpec("image_topic", "/camera/image_raw", "sensor_msgs/Image output", "str", topic_name),
    ParamSpec("instruction_topic", "/oxygen/instruction", "std_msgs/String instruction output (latched)",
              "str", topic_name),
    ParamSpec("joint_state_topic", "/joint_states", "sensor_msgs/JointState gripper position output",
              "str", topic_name),
    ParamSpec("action_topic", "/oxygen/actions", "oxygen_ros/ActionChunk input", "str", topic_name),
)


class SyntheticCamera(Node):
    """A closed-loop simulated camera for the 2-D reach task."""

    def __init__(self, **kwargs: Any):
        super().__init__("oxygen_synthetic_camera", **kwargs)
        p = _declare_or_log(self, SYNTHETIC_CAMERA_PARAMETERS)
        self.rate_hz: float = p["rate_hz"]
        self.image_size: int = p["image_size"]
        self.retarget_every_s: float = p["retarget_every_s"]
        self.max_step: float = p["max_step"]
        self.frame_id: str = p["frame_id"]
        self.rng = np.random.default_rng(p["seed"])
        self.sim = sim_scene.Simulator(sim_scene.sample_scene(self.rng))
        self.frames = 0
        self.actions_applied = 0
        self.actions_rejected = 0
        self.retargets = 0
        self._last_retarget = self.get_clock().now()
        self._published_instruction: str | None = None
        self._throttle = Throttle(5.0)

        self._image_pub = self.create_publisher(Image, p["image_topic"], DATA_QOS)
        self._instruction_pub = self.create_publisher(String, p["instruction_topic"], LATCHED_QOS)
        self._state_pub = self.create_publisher(JointState, p["joint_state_topic"], DATA_QOS)
        self._action_sub = self.create_subscription(ActionChunk, p["action_topic"], self._on_actions, ACTIONS_QOS)
        self._timer = self.create_timer(1.0 / self.rate_hz, self._tick)
        self.add_on_set_parameters_callback(parameter_callback(SYNTHETIC_CAMERA_PARAMETERS))
        self.add_post_set_parameters_callback(self._apply_parameters)
        self._publish_instruction()
        self.get_logger().info(
            f"synthetic scene (seed {p['seed']}): {self.sim.instruction!r}, {self.image_size} px at "
            f"{self.rate_hz} Hz on {p['image_topic']}; actions from {p['action_topic']}")

    def _apply_parameters(self, params: list) -> None:
        for name, value in changed_values(SYNTHETIC_CAMERA_PARAMETERS, params).items():
            setattr(self, name, value)
            if name == "rate_hz":
                self._timer.cancel()
                self.destroy_timer(self._timer)
                self._timer = self.create_timer(1.0 / self.rate_hz, self._tick)

    def pause(self, paused: bool = True) -> None:
        """Stop publishing (a camera drop-out, as ``oxygen-soak`` injects one) or, with
        ``paused=False``, publish again at the rate's next period."""
        if paused:
            self._timer.cancel()
        else:
            self._timer.reset()

    def _publish_instruction(self) -> None:
        text = self.sim.instruction
        if text != self._published_instruction:
            self._instruction_pub.publish(String(data=text))
            self._published_instruction = text

    def _tick(self) -> None:
        now = self.get_clock().now()
        elapsed = (now - self._last_retarget).nanoseconds / 1e9
        reached = self.sim.reached()
        if reached or (self.retarget_every_s > 0 and elapsed >= self.retarget_every_s):
            self.sim.retarget(self.rng)
            self._last_retarget = now
            self.retargets += 1
            self.get_logger().info(
                f"target {'reached' if reached else f'moved after {elapsed:.1f} s'}: "
                f"{self.sim.scene.target.name} now at {tuple(round(v, 2) for v in self.sim.scene.target.position)}")
        self._publish_instruction()
        stamp = now.to_msg()
        self._image_pub.publish(rgb_to_image_msg(self.sim.observe(self.image_size), "rgb8", stamp, self.frame_id))
        state = JointState(header=Header(stamp=stamp, frame_id=self.frame_id), name=JOINT_NAMES)
        state.position = [float(v) for v in self.sim.state]
        self._state_pub.publish(state)
        self.frames += 1

    def _on_actions(self, msg: ActionChunk) -> None:
        try:
            actions = action_chunk_array(msg)
            if actions.shape[0] == 0 or actions.shape[1] < 2:
                raise ValueError(f"need at least one action of 2 values, got {actions.shape[0]}x{actions.shape[1]}")
            step = actions[0, :2].astype(np.float64)
            if not np.all(np.isfinite(step)):
                raise ValueError(f"non-finite action {step.tolist()}")
        except ValueError as exc:
            self.actions_rejected += 1
            if (n := self._throttle("actions")) is not None:
                self.get_logger().warning(f"ignored ActionChunk (observation {msg.observation_seq}): {exc}"
                                          + (f" ({n} more)" if n else ""))
            return
        norm = float(np.hypot(*step))
        if norm > self.max_step:
            step *= self.max_step / norm
        self.sim.step(step)
        self.actions_applied += 1


def synthetic_camera_main(args: list[str] | None = None) -> int:
    return run_node(SyntheticCamera, args)


# --------------------------------------------------------------------------
# Bag player
# --------------------------------------------------------------------------


def _bag_path(value: str, values=None) -> str | None:
    return None if value else "must name a rosbag2 directory (or an .mcap / .db3 file)"


BAG_PLAYER_PARAMETERS: tuple[ParamSpec, ...] = (
    ParamSpec("bag_path", "", "rosbag2 directory (MCAP or SQLite3) or single .mcap/.db3 file", "str", _bag_path),
    ParamSpec("rate", 1.0, "playback speed: 1.0 = recorded timing, 2.0 = twice as fast", "float", positive,
              dynamic=True),
    ParamSpec("topics", [], "topics to play; empty: all", "str_list", topic_list),
    ParamSpec("loop", False, "start again at the end", "bool", dynamic=True),
    ParamSpec("lockstep", False, "hold the next image until an ActionChunk for a newer observation arrives",
              "bool", dynamic=True),
    ParamSpec("lockstep_timeout_s", 5.0, "seconds to wait for that ActionChunk before playing on", "float",
              positive, dynamic=True),
    ParamSpec("action_topic", "/oxygen/actions", "oxygen_ros/ActionChunk input used by lockstep", "str", topic_name),
    ParamSpec("latched_topics", ["/oxygen/instruction"], "topics published transient-local (besides those "
              "recorded transient-local)", "str_list", topic_list),
    ParamSpec("restamp", True, "shift header stamps by (now - recorded time) so that consumers comparing "
              "stamps with their clock see fresh data", "bool"),
    ParamSpec("start_delay_s", 0.5, "seconds between creating the publishers and the first message "
              "(lets subscribers match)", "float", non_negative),
    ParamSpec("shutdown_when_done", True, "exit when the bag has been played (not looping)", "bool", dynamic=True),
)


class BagPlayer(Node):
    """Replays a rosbag2 bag on its recorded topics."""

    TICK_S = 0.002
    MAX_BURST = 200  # messages per tick, so that callbacks (lockstep) keep running

    def __init__(self, **kwargs: Any):
        super().__init__("oxygen_bag_player", **kwargs)
        p = _declare_or_log(self, BAG_PLAYER_PARAMETERS)
        try:
            self._reader = open_bag(p["bag_path"])
        except BagError as exc:
            self._fail("bag_path", str(exc))
        self._setup_topics(p)  # on error: logged, node destroyed (bag closed), ParameterError raised
        self.bag_path: str = p["bag_path"]
        self.rate: float = p["rate"]
        self.loop: bool = p["loop"]
        self.lockstep: bool = p["lockstep"]
        self.lockstep_timeout_s: float = p["lockstep_timeout_s"]
        self.restamp: bool = p["restamp"]
        self.shutdown_when_done: bool = p["shutdown_when_done"]

        self.done = Future()  # result set when finished and shutdown_when_done
        self.finished = False
        self.published = 0
        self.passes = 0
        self.lockstep_timeouts = 0
        self.action_seq = -1  # highest ActionChunk.observation_seq seen
        self._gate_seq = -1
        self._images_since_release: set[str] = set()
        self._hold_since: float | None = None
        self._start_at = time.monotonic() + p["start_delay_s"]
        self._iter = None
        self._pending = None
        self._t0_bag = 0
        self._t0_wall = 0.0
        self._action_sub = self.create_subscription(ActionChunk, p["action_topic"], self._on_actions, ACTIONS_QOS)
        self.add_on_set_parameters_callback(parameter_callback(BAG_PLAYER_PARAMETERS))
        self.add_post_set_parameters_callback(self._apply_parameters)
        self._timer = self.create_timer(self.TICK_S, self._tick)
        listing = ", ".join(f"{t} ({self._types[t]}{', latched' if t in self._latched else ''})"
                            for t in self._publishers_by_topic)
        self.get_logger().info(f"playing {self.bag_path} at rate {self.rate}"
                               f"{' in lockstep' if self.lockstep else ''}: {listing}")

    @property
    def publishers_by_topic(self) -> Mapping[str, Any]:
        """The publisher of each topic this player plays (a read-only view)."""
        return MappingProxyType(self._publishers_by_topic)

    def start_now(self) -> None:
        """Play from the next tick on, cutting ``start_delay_s`` short (for a caller that
        has already seen its subscribers match)."""
        self._start_at = time.monotonic()

    def _fail(self, name: str, reason: str) -> None:
        exc = ParameterError(name, reason)
        self.get_logger().fatal(str(exc))
        self.destroy_node()
        raise exc

    def _setup_topics(self, p: dict[str, Any]) -> None:
        recorded = bag_topics(self._reader)
        wanted = p["topics"] or list(recorded)
        missing = [t for t in wanted if t not in recorded]
        if missing:
            self.get_logger().warning(f"topics {missing} are not in the bag (it has {sorted(recorded)})")
        self._classes: dict[str, type] = {}
        self._types: dict[str, str] = {}
        self._latched: set[str] = set()
        self._stamped: set[str] = set()  # topics whose type has a std_msgs/Header `header`
        self._publishers_by_topic: dict[str, Any] = {}
        for topic in wanted:
            info = recorded.get(topic)
            if info is None:
                continue
            try:
                cls = message_class(info.msgtype)
            except BagError as exc:
                self.get_logger().warning(f"skipping {topic}: {exc}")
                continue
            latched = info.latched or topic in p["latched_topics"]
            self._classes[topic] = cls
            if cls.get_fields_and_field_types().get("header") == "std_msgs/Header":
                self._stamped.add(topic)
            self._types[topic] = info.msgtype
            if latched:
                self._latched.add(topic)
            self._publishers_by_topic[topic] = self.create_publisher(
                cls, topic, LATCHED_QOS if latched else DATA_QOS)
        if not self._publishers_by_topic:
            self._fail("topics", f"nothing to play: none of {wanted} is in the bag with an available type")
        self._connections = [c for c in self._reader.connections if c.topic in self._publishers_by_topic]

    def _apply_parameters(self, params: list) -> None:
        for name, value in changed_values(BAG_PLAYER_PARAMETERS, params).items():
            if name == "rate" and self._pending is not None:
                # keep the position in the bag: re-anchor the time base
                self._t0_bag, self._t0_wall = self._pending[1], time.monotonic()
            setattr(self, name, value)
        if self.finished and self.shutdown_when_done and not self.done.done():
            self.done.set_result(True)

    def _on_actions(self, msg: ActionChunk) -> None:
        self.action_seq = max(self.action_seq, int(msg.observation_seq))

    # -- playback -------------------------------------------------------------

    def _next(self):
        try:
            return next(self._iter)
        except StopIteration:
            return None

    def _start_pass(self) -> bool:
        self._iter = self._reader.messages(connections=self._connections)
        self._pending = self._next()
        if self._pending is None:
            return False
        self.passes += 1
        self._t0_bag, self._t0_wall = self._pending[1], time.monotonic()
        return True

    def _gate_open(self, topic: str, now: float) -> bool:
        """Lockstep: may this image go out now?"""
        if topic not in self._images_since_release:
            return True
        if self.action_seq > self._gate_seq:
            released = True
        elif self._hold_since is not None and now - self._hold_since >= self.lockstep_timeout_s:
            self.lockstep_timeouts += 1
            self.get_logger().warning(
                f"lockstep: no ActionChunk newer than observation {self._gate_seq} within "
                f"{self.lockstep_timeout_s} s; playing on")
            released = True
        else:
            released = False
        if not released:
            if self._hold_since is None:
                self._hold_since = now
            return False
        self._gate_seq = self.action_seq
        self._images_since_release.clear()
        return True

    def _tick(self) -> None:
        if self.finished:
            return
        now = time.monotonic()
        if now < self._start_at:
            return
        if self._iter is None and not self._start_pass():
            self._finish("the bag has no messages on the selected topics")
            return
        for _ in range(self.MAX_BURST):
            if self._pending is None:
                if self.loop and self._start_pass():
                    self.get_logger().info(f"looping: pass {self.passes}")
                    return  # at most one pass per tick
                else:
                    self._finish(f"played {self.published} messages in {self.passes} pass(es)")
                    return
            conn, stamp_ns, raw = self._pending
            due = self._t0_wall + (stamp_ns - self._t0_bag) / 1e9 / self.rate
            if due > now:
                return
            topic = conn.topic
            is_image = self._types[topic] in IMAGE_TYPES
            if self.lockstep and is_image:
                if not self._gate_open(topic, now):
                    return
                if self._hold_since is not None:
                    self._t0_wall += now - max(due, self._hold_since)  # keep recorded spacing after the wait
                    self._hold_since = None
                self._images_since_release.add(topic)
            self._publish(topic, stamp_ns, raw)
            self._pending = self._next()

    def _publish(self, topic: str, stamp_ns: int, raw: bytes) -> None:
        publisher = self._publishers_by_topic[topic]
        if self.restamp and topic in self._stamped:
            msg = deserialize_message(bytes(raw), self._classes[topic])
            old = stamp_to_ns(msg.header.stamp)
            if old != 0:  # an unset stamp stays unset
                shift = self.get_clock().now().nanoseconds - stamp_ns
                msg.header.stamp = ns_to_time_msg(max(0, old + shift))
            publisher.publish(msg)
            self.published += 1
            return
        publisher.publish(bytes(raw))
        self.published += 1

    def _finish(self, text: str) -> None:
        self.finished = True
        self._timer.cancel()
        self.get_logger().info(f"finished {self.bag_path}: {text}"
                               + (f"; {self.lockstep_timeouts} lockstep timeout(s)" if self.lockstep_timeouts else ""))
        if self.shutdown_when_done and not self.done.done():
            self.done.set_result(True)

    def destroy_node(self) -> None:
        reader = getattr(self, "_reader", None)
        if reader is not None:
            reader.close()
            self._reader = None
        super().destroy_node()


def bag_player_main(args: list[str] | None = None) -> int:
    return run_node(BagPlayer, args, until_done=True)


__all__ = ["BagPlayer", "SyntheticCamera", "bag_player_main", "synthetic_camera_main"]

"""``oxygen_synthetic_camera``: a synthetic closed-loop camera for the 2-D reach task.

:class:`SyntheticCamera` (executable ``synthetic_camera``, :func:`synthetic_camera_main`)
renders the scene of :mod:`oxygen_ros.core.sim.scene` as an rgb8
``sensor_msgs/Image``, publishes the instruction (latched) and the gripper
position as ``sensor_msgs/JointState`` (:data:`JOINT_NAMES`), and applies the
first action (first two values, a displacement) of every ``ActionChunk`` it
receives to the simulated gripper, so the demo is closed-loop. When the
gripper reaches the target, or every ``retarget_every_s``, the target moves
(logged at most once every 5 s, counting the moves since the last line).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
from rclpy.node import Node
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Header, String

from oxygen_ros.core.sim import scene as sim_scene
from oxygen_ros.core.throttle import Throttle
from oxygen_ros.msg import ActionChunk
from oxygen_ros.ros.conversions import action_chunk_array, rgb_to_image_msg
from oxygen_ros.ros.node_help import NodeHelp
from oxygen_ros.ros.node_main import run_node
from oxygen_ros.ros.plan_tables import DEMO_IMAGE_SIZE
from oxygen_ros.ros.params_files import node_start
from oxygen_ros.ros.parameter_changes import changed_values, check_parameter_changes, log_changes
from oxygen_ros.ros.parameters import ParamSpec, declare_parameters_or_fail, non_negative, positive, topic_name
from oxygen_ros.ros.qos import ACTIONS_QOS, DATA_QOS, LATCHED_QOS

NODE_NAME = "oxygen_synthetic_camera"
JOINT_NAMES = ["gripper_x", "gripper_y"]


def _sim_image_size(value: int, values=None) -> str | None:
    return None if 8 <= value <= 1024 else f"must be between 8 and 1024 pixels, got {value}"


SYNTHETIC_CAMERA_PARAMETERS: tuple[ParamSpec, ...] = (
    ParamSpec("rate_hz", 10.0, "frames per second", "float", positive, dynamic=True),
    ParamSpec("image_size", DEMO_IMAGE_SIZE, "side in pixels of the square rendered image", "int", _sim_image_size, dynamic=True,
              constraints="8..1024"),
    ParamSpec("seed", 0, "random seed of the scene and of the target moves", "int"),
    ParamSpec("retarget_every_s", 8.0, "seconds between target moves (also moved when reached); 0: only when reached",
              "float", non_negative, dynamic=True),
    ParamSpec("max_step", sim_scene.MAX_STEP, "largest gripper displacement applied per action (norm, scene units)",
              "float", positive, dynamic=True),
    ParamSpec("frame_id", "camera", "header.frame_id of the images", "str", dynamic=True),
    ParamSpec("image_topic", "camera/image_raw", "sensor_msgs/Image output", "str", topic_name),
    ParamSpec("instruction_topic", "oxygen/instruction", "std_msgs/String instruction output (latched)",
              "str", topic_name),
    ParamSpec("joint_state_topic", "joint_states", "sensor_msgs/JointState gripper position output",
              "str", topic_name),
    ParamSpec("action_topic", "oxygen/actions", "oxygen_ros/ActionChunk input", "str", topic_name),
)


class SyntheticCamera(Node):
    """A closed-loop simulated camera for the 2-D reach task."""

    def __init__(self, **kwargs: Any):
        super().__init__(NODE_NAME, **kwargs)
        p = declare_parameters_or_fail(self, SYNTHETIC_CAMERA_PARAMETERS, node_start(NODE_NAME, kwargs))
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
        self._moves_unlogged: Counter[str] = Counter()  # "reached" / "moved": since the last line about them

        self._image_pub = self.create_publisher(Image, p["image_topic"], DATA_QOS)
        self._instruction_pub = self.create_publisher(String, p["instruction_topic"], LATCHED_QOS)
        self._state_pub = self.create_publisher(JointState, p["joint_state_topic"], DATA_QOS)
        self._action_sub = self.create_subscription(ActionChunk, p["action_topic"], self._on_actions, ACTIONS_QOS)
        self._timer = self.create_timer(1.0 / self.rate_hz, self._tick)
        check_parameter_changes(self, SYNTHETIC_CAMERA_PARAMETERS)
        self.add_post_set_parameters_callback(self._apply_parameters)
        self._publish_instruction()
        self.get_logger().info(
            f"synthetic scene (seed {p['seed']}): {self.sim.instruction!r}, {self.image_size} px at "
            f"{self.rate_hz} Hz on {self._image_pub.topic_name}; actions from {self._action_sub.topic_name}")

    def _apply_parameters(self, params: list) -> None:
        changes = changed_values(SYNTHETIC_CAMERA_PARAMETERS, params)
        before = {name: getattr(self, name, None) for name in changes}
        for name, value in changes.items():
            setattr(self, name, value)
            if name == "rate_hz":
                self._timer.cancel()
                self.destroy_timer(self._timer)
                self._timer = self.create_timer(1.0 / self.rate_hz, self._tick)
        log_changes(self, changes, before=before)

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
            self._log_retarget(reached, elapsed)
        self._publish_instruction()
        stamp = now.to_msg()
        self._image_pub.publish(rgb_to_image_msg(self.sim.observe(self.image_size), "rgb8", stamp, self.frame_id))
        state = JointState(header=Header(stamp=stamp, frame_id=self.frame_id), name=JOINT_NAMES)
        state.position = [float(v) for v in self.sim.state]
        self._state_pub.publish(state)
        self.frames += 1

    def _log_retarget(self, reached: bool, elapsed: float) -> None:
        """A line per target move, at most one every 5 s: a policy that works reaches
        several targets a second, and the line then counts the moves since the last one."""
        self._moves_unlogged["reached" if reached else "moved"] += 1
        if self._throttle("retarget") is None:
            return
        moves, self._moves_unlogged = self._moves_unlogged, Counter()
        what = "reached" if reached else f"moved after {elapsed:.1f} s"
        if moves.total() > 1:
            what += f" ({moves['reached']} reached and {moves['moved']} moved since the last line)"
        target = self.sim.scene.target
        self.get_logger().info(f"target {what}: {target.name} now at {tuple(round(v, 2) for v in target.position)}")

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


ABOUT = NodeHelp("synthetic_camera", NODE_NAME, (
    "a simulated robot for trying the package without hardware: renders a 2-D reach scene as an rgb8 Image, "
    "publishes the instruction and the gripper's JointState, and moves the gripper by the first action of "
    "every ActionChunk it receives."), SYNTHETIC_CAMERA_PARAMETERS)


def synthetic_camera_main(args: list[str] | None = None) -> int:
    return run_node(SyntheticCamera, args, about=ABOUT)


__all__ = ["JOINT_NAMES", "SYNTHETIC_CAMERA_PARAMETERS", "SyntheticCamera", "synthetic_camera_main"]

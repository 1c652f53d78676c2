"""``oxygen_bag_player``: replays a rosbag2 bag as the robot would publish it.

:class:`BagPlayer` (executable ``bag_player``, :func:`bag_player_main`)
replays a rosbag2 bag (MCAP or SQLite3, detected from the bag) on the
recorded topics with the recorded types and timing (scaled by ``rate``),
optionally in lockstep with the model (an image is held until an ActionChunk
for a newer observation arrived), optionally looping. A bag of several robots
(``/left/camera/image_raw``, ``/right/camera/image_raw``, ...) plays in
lockstep with ``lockstep_robots: [left, right]``: each image waits for an
ActionChunk of its own robot (``/left/oxygen/actions``), see :mod:`.lockstep`.

Nothing of the bag is lost to discovery: before the first message the player
waits until every topic it plays has a matched subscription and, in lockstep,
every ActionChunk topic it waits on a matched publisher (the policy's, which
may be a participant of its own: the inference node's control process) (at most
``wait_for_subscribers_s``; then it logs the topics still unmatched and plays
anyway), then ``start_delay_s`` more, so that best-effort subscribers, which
drop what arrives before they have matched the player's writer in turn, have
done so too. Latched topics (recorded transient-local, or in
``latched_topics``) are published transient-local, so a subscriber that comes
later still gets their last message.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from rclpy.clock import Clock, ClockType
from rclpy.node import Node
from rclpy.serialization import deserialize_message
from rclpy.task import Future

from oxygen_ros.msg import ActionChunk
from oxygen_ros.ros.bag_choice import OWN_TOPICS, checked_choice, excluded, nothing_to_play
from oxygen_ros.ros.bags import BagError, bag_topics, message_class, open_bag
from oxygen_ros.ros.conversions import ns_to_time_msg, stamp_to_ns
from oxygen_ros.ros.lockstep import LockstepGate, gate_key, gate_topics
from oxygen_ros.ros.node_help import NodeHelp
from oxygen_ros.ros.node_main import run_node
from oxygen_ros.ros.params_files import node_start
from oxygen_ros.ros.parameter_changes import changed_values, check_parameter_changes, log_changes
from oxygen_ros.ros.parameters import (ParameterError, ParamSpec, declare_parameters_or_fail, non_negative, positive,
                                       topic_list, topic_name)
from oxygen_ros.ros.qos import ACTIONS_QOS, DATA_QOS, LATCHED_QOS
from oxygen_ros.ros.robots import robot_names_check

NODE_NAME = "oxygen_bag_player"
IMAGE_TYPES = ("sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage")
STATE_TYPE = "sensor_msgs/msg/JointState"
def _bag_path(value: str, values=None) -> str | None:
    return None if value else "must name a rosbag2 directory (or an .mcap / .db3 file)"


BAG_PLAYER_PARAMETERS: tuple[ParamSpec, ...] = (
    ParamSpec("bag_path", "", "rosbag2 directory (MCAP or SQLite3) or single .mcap/.db3 file", "str", _bag_path,
              constraints="not empty"),
    ParamSpec("rate", 1.0, "playback speed: 1.0 = recorded timing, 2.0 = twice as fast", "float", positive,
              dynamic=True),
    ParamSpec("topics", [], "topics to play; empty: all but exclude_topics", "str_list", topic_list),
    ParamSpec("exclude_topics", OWN_TOPICS, "topics not played when topics is empty, also under a namespace "
              "(/left/oxygen/actions): the stack's own outputs and ROS's bookkeeping, which a bag recorded "
              "with -a of a running agent holds", "str_list", topic_list),
    ParamSpec("loop", False, "start again at the end", "bool", dynamic=True),
    ParamSpec("lockstep", False, "hold the next image until an ActionChunk for a newer observation arrives",
              "bool", dynamic=True),
    ParamSpec("lockstep_timeout_s", 5.0, "seconds to wait for that ActionChunk before playing on", "float",
              positive, dynamic=True),
    ParamSpec("action_topic", "/oxygen/actions", "oxygen_ros/ActionChunk input used by lockstep", "str", topic_name),
    ParamSpec("lockstep_robots", [], "robots of a bag of several: an image topic under /<robot>/ waits in lockstep "
              "for ActionChunks on /<robot> + action_topic, any other image topic on action_topic; empty: every "
              "image on action_topic", "str_list", robot_names_check,
              constraints="unique ROS name tokens (a letter, then letters, digits or _)"),
    ParamSpec("latched_topics", ["/oxygen/instruction"], "topics published transient-local (besides those "
              "recorded transient-local)", "str_list", topic_list),
    ParamSpec("restamp", True, "shift header stamps by (now - recorded time) so that consumers comparing "
              "stamps with their clock see fresh data", "bool"),
    ParamSpec("wait_for_subscribers_s", 5.0, "seconds to wait, before the first message, until every played "
              "topic has a matched subscription; when they pass, the topics still unmatched are logged and the "
              "bag plays anyway (0: do not wait)", "float", non_negative),
    ParamSpec("start_delay_s", 0.25, "seconds between the end of that wait and the first message (lets "
              "best-effort subscribers match the player's writers too)", "float", non_negative),
    ParamSpec("shutdown_when_done", True, "exit when the bag has been played (not looping)", "bool", dynamic=True),
)


class BagPlayer(Node):
    """Replays a rosbag2 bag on its recorded topics."""

    TICK_S = 0.002
    MAX_BURST = 200  # messages per tick, so that callbacks (lockstep) keep running

    def __init__(self, **kwargs: Any):
        super().__init__(NODE_NAME, **kwargs)
        p = declare_parameters_or_fail(self, BAG_PLAYER_PARAMETERS, node_start(NODE_NAME, kwargs))
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
        self.lockstep_robots: list[str] = p["lockstep_robots"]
        self.wait_for_subscribers_s: float = p["wait_for_subscribers_s"]
        self.start_delay_s: float = p["start_delay_s"]
        self._created_at = time.monotonic()
        self._start_at: float | None = None  # set when the wait for subscribers ends
        self._start_now = False  # start_now() was called (from any thread)
        self._iter = None
        self._pending = None
        self._t0_bag = 0
        self._t0_wall = 0.0
        self._setup_gates(p)
        check_parameter_changes(self, BAG_PLAYER_PARAMETERS)
        self.add_post_set_parameters_callback(self._apply_parameters)
        # steady time, as the pacing (time.monotonic): a ROS-time timer stands still while the system
        # clock is stepped back, or, with use_sim_time, until /clock comes
        self._timer = self.create_timer(self.TICK_S, self._tick, clock=Clock(clock_type=ClockType.STEADY_TIME))
        listing = ", ".join(f"{t} ({self._types[t]}{', latched' if t in self._latched else ''})"
                            for t in self._publishers_by_topic)
        self.get_logger().info(f"playing {self.bag_path} at rate {self.rate}"
                               f"{' in lockstep' if self.lockstep else ''}{self._gates_listing()}: {listing}")

    def _setup_gates(self, p: dict[str, Any]) -> None:
        """A lockstep gate on ``action_topic``, and one per robot of ``lockstep_robots``."""
        if p["lockstep_robots"] and not p["action_topic"].startswith("/"):
            self._fail("action_topic", f"must be absolute with lockstep_robots (the robots' topics are "
                                       f"/<robot>{p['action_topic']}), got {p['action_topic']!r}")
        robots = p["lockstep_robots"]
        images = [t for t in self._publishers_by_topic if self._types[t] in IMAGE_TYPES]
        states = [t for t in self._publishers_by_topic if self._types[t] == STATE_TYPE]
        self._gates = {key: LockstepGate(topic, tuple(t for t in images if gate_key(t, robots) == key),
                                         tuple(t for t in states if gate_key(t, robots) == key))
                       for key, topic in gate_topics(p["action_topic"], robots).items()}
        self._gate_of = {t: self._gates[gate_key(t, robots)] for t in self._publishers_by_topic}
        self._action_subs = [(gate, self.create_subscription(ActionChunk, gate.action_topic, gate.on_actions,
                                                             ACTIONS_QOS)) for gate in self._gates.values()]

    def _gates_listing(self) -> str:
        images = [t for t in self._publishers_by_topic if self._types[t] in IMAGE_TYPES]
        if not self.lockstep_robots or not images:
            return ""
        return " (" + ", ".join(f"{t} on {self._gate_of[t].action_topic}" for t in images) + ")"

    @property
    def lockstep_gates(self) -> Mapping[str, LockstepGate]:
        """The lockstep gate of each robot ("": the one on ``action_topic``), read-only."""
        return MappingProxyType(self._gates)

    @property
    def action_seq(self) -> int:
        """The highest ``observation_seq`` of the ActionChunks on ``action_topic``."""
        return self._gates[""].action_seq

    @property
    def lockstep_timeouts(self) -> int:
        """Images let out because no ActionChunk came within ``lockstep_timeout_s`` (every gate)."""
        return sum(gate.timeouts for gate in self._gates.values())

    @property
    def publishers_by_topic(self) -> Mapping[str, Any]:
        """The publisher of each topic this player plays (a read-only view)."""
        return MappingProxyType(self._publishers_by_topic)

    def unmatched_topics(self) -> list[str]:
        """The played topics that have no matched subscription now, and (lockstep) the
        ActionChunk topics that have no matched publisher, of the gates that hold images (with
        ``lockstep_robots``, the gate on ``action_topic`` itself holds none when every image
        topic is a robot's: nothing publishes there, and nothing need)."""
        return ([t for t, pub in self._publishers_by_topic.items() if pub.get_subscription_count() == 0]
                + [sub.topic_name for gate, sub in self._action_subs
                   if self.lockstep and gate.image_topics and sub.get_publisher_count() == 0])

    def start_now(self) -> None:
        """Play from the next tick on, cutting the wait for subscribers and ``start_delay_s``
        short (for a caller that has already seen its subscribers match). A flag the tick reads,
        never cleared: writing the start time from another thread raced the tick that sets it
        (the tick's own ``start_delay_s`` written over this call's start)."""
        self._start_now = True

    def _ready(self, now: float) -> bool:
        """Whether playback may start: every topic matched (or the wait over), then ``start_delay_s``."""
        if self._start_now:
            return True
        if self._start_at is None:
            unmatched = self.unmatched_topics()
            waited = now - self._created_at
            if unmatched and waited < self.wait_for_subscribers_s:
                return False
            if unmatched:
                self.get_logger().warning(
                    f"nothing matched within {self.wait_for_subscribers_s} s on {len(unmatched)} topic(s): "
                    f"{', '.join(unmatched)}; playing anyway")
            else:
                self.get_logger().info(f"every topic has a subscriber (after {waited:.2f} s): starting in "
                                       f"{self.start_delay_s} s")
            self._start_at = now + self.start_delay_s
        return now >= self._start_at

    def _fail(self, name: str, reason: str) -> None:
        exc = ParameterError(name, reason)
        self.get_logger().fatal(str(exc))
        self.destroy_node()
        raise exc

    def _setup_topics(self, p: dict[str, Any]) -> None:
        recorded = bag_topics(self._reader)
        wanted = p["topics"] or [t for t in recorded if not excluded(t, p["exclude_topics"])]
        refusal = checked_choice(p, recorded, wanted, self.get_logger())
        if refusal is not None:
            self._fail(*refusal)
        self._classes: dict[str, type] = {}
        self._types: dict[str, str] = {}
        self._latched: set[str] = set()
        self._stamped: set[str] = set()  # topics whose type has a std_msgs/Header `header`
        self._publishers_by_topic: dict[str, Any] = {}
        for topic in wanted:
            info = recorded.get(topic)
            if info is None:
                continue
            if info.outdated:  # rclpy would fail on its first message, mid-play
                self.get_logger().warning(f"not playing {topic}: {info.outdated}")
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
            self._fail(*nothing_to_play(p, recorded, wanted))
        self._connections = [c for c in self._reader.connections if c.topic in self._publishers_by_topic]

    def _apply_parameters(self, params: list) -> None:
        changes = changed_values(BAG_PLAYER_PARAMETERS, params)
        log_changes(self, changes)
        for name, value in changes.items():
            if name == "rate" and self._pending is not None:
                # keep the position in the bag: re-anchor the time base at the bag's present (the next
                # message's wait goes on at the new rate; anchored at that message, it played at once)
                now = time.monotonic()
                present = self._t0_bag + (now - self._t0_wall) * self.rate * 1e9
                self._t0_bag, self._t0_wall = min(present, self._pending[1]), now
            setattr(self, name, value)
        if self.finished and self.shutdown_when_done and not self.done.done():
            self.done.set_result(True)

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
        """Lockstep: may this image go out now? (Its robot's gate decides.)"""
        released, warning = self._gate_of[topic].open(topic, now, self.lockstep_timeout_s)
        if warning is not None:
            self.get_logger().warning(warning)
        return released

    def _tick(self) -> None:
        if self.finished:
            return
        now = time.monotonic()
        if not self._ready(now):
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
                gate = self._gate_of[topic]
                if gate.hold_since is not None:
                    self._t0_wall += now - max(due, gate.hold_since)  # keep recorded spacing after the wait
                    gate.hold_since = None
                gate.sent(topic)
            elif self._types[topic] == STATE_TYPE:
                self._gate_of[topic].state_sent(topic)
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


ABOUT = NodeHelp("bag_player", NODE_NAME, (
    "replays a rosbag2 bag (bag_path: MCAP or SQLite3) on its recorded topics and types with its recorded "
    "timing scaled by rate, optionally in lockstep with the model and looping; it ends when the bag has "
    "played."), BAG_PLAYER_PARAMETERS)


def bag_player_main(args: list[str] | None = None) -> int:
    return run_node(BagPlayer, args, until_done=True, about=ABOUT)


__all__ = ["BAG_PLAYER_PARAMETERS", "IMAGE_TYPES", "BagPlayer", "bag_player_main"]

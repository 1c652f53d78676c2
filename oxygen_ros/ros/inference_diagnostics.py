"""The inference node's figures and ``/diagnostics``: the node's, and each robot's.

One robot (``robots`` empty): one status, ``<node>: engine``, as always (``<node>``: the node's
namespace and name, ``robot1/oxygen_inference``; ``oxygen_inference`` in the root namespace). Several
robots: that status carries the node's totals (ticks and underruns summed over
the robots, the oldest chunk and observation, ``faulted`` when any robot's
output is stopped), and one status per robot, ``<node>: robot <r>``, carries
that robot's figures: its chunk clock (``chunk_age_ms``, ``underruns``), its
``action_frequency_hz`` (H x its chunks per second over the last 5 s), its
``tokens_per_s``, its ``frame_share`` (the mean of 1 / observations in each
of its frames: the part of a frame's cost that is its own) and its counters.
Console warnings name the robot, except the node's own (another node of its
name, inputs sent to the one-robot topics: :data:`~.inference_status.NODE_CONSOLE`).
With ``robots`` set (one robot or several), the node's status names what is
still sent to the one-robot topics (``unserved_inputs``, :mod:`.unserved_inputs`).
"""

from __future__ import annotations

import collections
import time
from typing import Optional

from ..core.chunk_clock import capture_to_action_ms
from ..core.stats import WindowRate
from .diagnostic_message import diagnostic_array
from .inference_status import CONSOLE, NODE_CONSOLE, ROBOT_CONSOLE, diagnostic_figures, inactive_kept
from .unserved_inputs import unserved_inputs

#: Counters that belong to the engine (every robot's frames), not to one robot.
ENGINE_COUNTERS = ("missed_ticks", "language_frames", "instructions_truncated")


def clock_figures(ios: list, now_ros: int, span_ns: int) -> tuple[Optional[int], dict]:
    """The robots' (``ios``) newest chunk age (the oldest of them) and tick figures, with the delay
    from capture to action and the time between observations of one robot: the one whose chunks come
    closest to running out before its next observation (``span_ns``: a chunk's span)."""
    clocks = [io.output.clock for io in ios]
    ages = [a for a in (c.age_ns(now_ros) for c in clocks) if a is not None]
    pairs = [(capture_to_action_ms(io.output.clock.first_ticks, span_ns), io.inputs.obs_interval_ms.percentile(50))
             for io in ios]
    delay, interval = max(pairs, key=lambda p: _nan_low(p[0] + p[1]))
    ticks = {"underruns": sum(c.underruns for c in clocks), "ticks": max(c.ticks for c in clocks),
             "ticks_waiting": sum(c.waiting for c in clocks),
             "capture_to_action_ms": delay, "observation_interval_ms": interval}
    return (max(ages) if ages else None), ticks


def _nan_low(value: float) -> float:
    """``value``, or minus infinity for NaN (so that a robot without the figures is never the one chosen)."""
    return value if value == value else float("-inf")


class InferenceDiagnostics:
    """The diagnostics half of :class:`~.inference_node.InferenceNode` (a mixin: it reads the
    node's lock, loop, robots, worker, engine and parameters; ``_sync_ticks()`` brings back
    the control process's tick figures first)."""

    @property
    def robot_names(self) -> tuple:
        """The robots served ("" for the only one, when ``robots`` is empty), configured or not."""
        return tuple(self.params["robots"] or [""])

    def _io(self, robot: Optional[str]):
        return next(iter(self.robot_io.values())) if robot is None else self.robot_io[robot]

    def frame_records(self, robot: Optional[str] = None) -> dict:
        """A copy of ``robot``'s recent observation frames' timings, by engine frame id (None: the first robot's)."""
        with self._cond:
            self._sync_ticks()
            return self._io(robot).inputs.records.copy()

    def tick_counts(self, robot: Optional[str] = None) -> dict:
        """``robot``'s control ticks so far: all, those that published, underruns, before the first
        chunk (None: the first robot's)."""
        with self._cond:
            self._sync_ticks()
            return self._io(robot).output.counts()

    def action_subscribers(self, robot: Optional[str] = None) -> int:
        """The subscriptions ``robot``'s ActionChunk publisher has matched (None: the first robot's):
        once it is one, the robot's controller gets every ActionChunk from then on. With the
        control process, as of its last tick."""
        with self._cond:
            self._sync_ticks()
            return self._io(robot).output.subscribers

    def _restart_statuses(self) -> None:
        """Every status counts from now (an activate: the underruns before the last deactivate
        are not reported again as new, and a robot's chunk rate is not lowered by the inactive
        seconds still in its window)."""
        for io in self.robot_io.values():
            io.chunk_rate = WindowRate(io.chunk_rate.window_s)  # the worker that adds to it starts after
        for robot in self._status_robots():
            self._reporter(robot).restart(self.diagnostics(robot))

    def _status_robots(self) -> list[Optional[str]]:
        """Whose statuses /diagnostics carries: the node's (None), and each robot's when several."""
        return [None, *self.robot_io] if len(self.robot_io) > 1 else [None]

    def _reporter(self, robot: Optional[str]):
        """The StatusReporter of the node's status (None) or of ``robot``'s."""
        return self._status if robot is None else self.robot_io[robot].status

    def diagnostics(self, robot: Optional[str] = None) -> dict:
        """The figures published on /diagnostics: the node's (None) or ``robot``'s."""
        now_ros = self._now_ros()
        several = len(self.robot_io) > 1
        with self._cond:
            self._sync_ticks()  # the control process's ticks (with control_process)
            ios = list(self.robot_io.values()) if robot is None else [self.robot_io[robot]]
            age_ns, ticks = clock_figures(ios, now_ros, self.horizon * self.loop.period_ns)
            subscribers = sum(io.output.subscribers for io in ios)
            loop = self.loop.figures(now_ros, robot)
            if robot is None and several:
                loop.update(self._worst(now_ros))
        if robot is None:
            counters, rate = self.counters, self.text.rate(time.monotonic())
        else:
            io = self.robot_io[robot]
            counters = collections.Counter(io.inputs.counters)
            counters.update({key: self.counters[key] for key in ENGINE_COUNTERS})
            rate = io.text.rate.rate(time.monotonic())
        d = diagnostic_figures(age_ns, ticks, loop, worker=self.worker, engine=self.engine, tokens_per_s=rate,
                               counters=counters, params=self.params, horizon=self.horizon,
                               tick_lateness_ms=self.tick_lateness_ms)
        d["control_failure"] = self.control_failure or ""  # the tick serves every robot
        d["worker_failure"] = (self.worker.death if self.worker else None) or ""
        d["control_silent_s"] = self.control_silent_s
        d["action_subscribers"] = subscribers  # controllers listening (summed over the robots for the node)
        d["same_name_nodes"], d["node_name"] = self.same_name_nodes(), self.get_fully_qualified_name()
        d["other_action_publishers"] = sum(max(0, self.count_publishers(io.output.topic) - 1) for io in ios)
        d["actions_topics"] = ", ".join(io.output.topic for io in ios)
        if robot is None and several:
            d["observation_age_robot"] = loop["observation_age_robot"]  # whose is observation_age_ms
        if robot is None and self.params["robots"]:  # (one named robot too: its topics are under /<robot>)
            d["unserved_inputs"] = "; ".join(unserved_inputs(self, self.params))
        if robot is not None and several:
            io = self.robot_io[robot]
            chunks = io.chunk_rate.rate(time.monotonic())
            d.update(robot=robot, action_frequency_hz=chunks * self.horizon, chunks_per_s=chunks,
                     frame_share=sum(io.frame_share) / len(io.frame_share) if io.frame_share else float("nan"))
        return d

    def same_name_nodes(self) -> int:
        """Other nodes on the ROS graph named as this one (another agent on this ROS_DOMAIN_ID, on
        this machine or the network: its actions go out on the same topics)."""
        mine = self.get_fully_qualified_name()
        return max(0, [f"{ns.rstrip('/')}/{name}" for name, ns in self.get_node_names_and_namespaces()].count(mine) - 1)

    def _worst(self, now_ros: int) -> dict:
        """Over every robot: the oldest observation, and the first stopped output."""
        figures = [self.loop.figures(now_ros, name) for name in self.robot_io]
        ages = {name: f["observation_age_ms"] for name, f in zip(self.robot_io, figures)
                if f["observation_age_ms"] == f["observation_age_ms"]}
        stalest = max(ages, key=ages.get) if ages else ""
        stopped = [f for f in figures if f["faulted"]] or figures
        worst = max(stopped, key=lambda f: f["consecutive_failures"])
        return {"observation_age_ms": ages[stalest] if ages else float("nan"), "observation_age_robot": stalest,
                "faulted": bool(stopped[0]["faulted"]), "consecutive_failures": worst["consecutive_failures"],
                "last_failure": worst["last_failure"]}

    def diagnostic_status(self, d: Optional[dict] = None, robot: Optional[str] = None) -> tuple:
        """(level, message) of the status published now, the node's or ``robot``'s."""
        d = self.diagnostics(robot) if d is None else d
        return self._reporter(robot).status(d, self.params["max_observation_age"])

    def _inactive_status(self) -> tuple[tuple, dict] | None:
        """((level, message), figures) while configured but not active (a lifecycle deactivate):
        a monitor sees the node paused by its manager, not a silent (dead) one. None once a
        cleanup took the engine (a callback already running on another thread)."""
        from diagnostic_msgs.msg import DiagnosticStatus

        engine = getattr(self, "engine", None)
        if engine is None:
            return None
        with self._cond:
            d = {"lifecycle_state": "inactive", "active_requests": engine.active_requests,
                 "queued_requests": engine.queued_requests, "questions_waiting": self.loop.questions_waiting()}
        return (DiagnosticStatus.OK, f"inactive (lifecycle): no action or text goes out; {inactive_kept(d)}"), d

    def status_name(self, what: str) -> str:
        """The name of the status ``what`` (``engine``, ``robot <r>``) on /diagnostics: the node's
        namespace and name, as the camera node names its own, ``robot1/oxygen_inference: engine``;
        ``oxygen_inference: engine`` in the root namespace."""
        return f"{self.get_fully_qualified_name().lstrip('/')}: {what}"

    def _engine_array(self, status, d: dict):
        """The DiagnosticArray of the engine's status, stamped now."""
        return diagnostic_array(self.status_name("engine"), self.params["device"], status, d,
                                self.get_clock().now().to_msg())

    def _lifecycle_array(self, status, d: dict, robots):
        """The DiagnosticArray of a node whose lifecycle state (``d["lifecycle_state"]``) is all
        there is to say: its status, and each of ``robots``' saying it too, not gone stale."""
        array = self._engine_array(status, d)
        for name in robots:
            self._add_robot_status(array, name, status, {"lifecycle_state": d["lifecycle_state"], "robot": name})
        return array

    def _add_robot_status(self, array, robot: str, status, d: dict) -> None:
        """Append ``robot``'s status (``status``: (level, message); ``d``: its figures) to ``array``."""
        array.status += diagnostic_array(self.status_name(f"robot {robot}"), self.params["device"], status, d,
                                         array.header.stamp).status

    def _publish_diagnostics(self) -> None:
        try:
            if not self.active:
                inactive = self._inactive_status()
                if inactive is not None:
                    self._pub_diag.publish(self._lifecycle_array(*inactive, self._status_robots()[1:]))
                return
            d = self.diagnostics()
            array = self._engine_array(self.diagnostic_status(d), d)
            # with several robots, the node's console lines are its own kinds, each robot's the others
            lines = self._status.console(NODE_CONSOLE if len(self.robot_io) > 1 else CONSOLE)
            for name in self._status_robots()[1:]:
                rd = self.diagnostics(name)
                self._add_robot_status(array, name, self.diagnostic_status(rd, name), rd)
                lines += [f"robot {name}: {line}" for line in self._reporter(name).console(ROBOT_CONSOLE)]
            self._pub_diag.publish(array)
            for line in lines:  # what a user must see without watching /diagnostics
                self.get_logger().warning(line)
        except Exception as exc:  # diagnostics must never end the node
            self.get_logger().error(f"diagnostics failed: {exc!r}", throttle_duration_sec=10.0)


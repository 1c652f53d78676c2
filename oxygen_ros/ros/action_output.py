"""The inference node's action output: what each control tick publishes, and the messages.

Each tick publishes the newest chunk's actions from the one due at the tick's
scheduled time onward (:class:`~oxygen_ros.core.chunk_clock.ChunkClock`), a
hold message (``hold_action: last``: the chunk's last row, offset = H) once the
chunk has run out, or nothing (waiting for a chunk, an underrun with
``hold_action: none``, or the action output stopped after repeated failures).
Ticks missed by a late timer are counted by the node's one :class:`TickGrid`,
which also gives every tick its scheduled time (serving several robots, one
timer ticks every robot's output). Not locked by itself: the node calls
:meth:`ActionOutput.tick`, :meth:`push` and :meth:`drop` with its lock held,
and :meth:`publish` without it.

The offset / stamp choice
    ``offset`` = index of the action due at the tick's *scheduled* time,
    counted from the chunk's origin; ``header.stamp`` = the time at which
    ``actions[0]`` of the message is due (``origin + offset * period``, at most
    one period before the tick). With ``chunk_origin: observation`` (default)
    the origin is the observation's capture stamp, so the actions that fell
    into the inference latency are skipped (delay compensation); a stamp not
    on this node's clock (a replayed bag, an unset stamp) falls back to
    ``frame_end``: the chunk is anchored at the first tick after the frame
    finished, which publishes offset 0.
"""

from __future__ import annotations

import collections
from typing import Optional

from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.msg import ActionChunk

from ..core.chunk_clock import NS_PER_S, Chunk, ChunkClock, Due
from ..core.frame_records import FrameRecords
from . import conversions
from .qos import reliable


#: With ``use_sim_time``, a tick called more than this many periods (and :data:`JUMP_MIN_NS`) after its
#: scheduled time was not late: the clock jumped forward (a /clock that starts late, a bag started at
#: an offset); a tick called before the one before, back (a bag played again, a simulation reset).
JUMP_PERIODS = 5
#: A stalled control thread lets /clock (depth 1) skip a few periods: those are missed ticks, no jump.
JUMP_MIN_NS = 1_000_000_000


class TickGrid:
    """The control timer's tick times: each tick's scheduled time (rclpy's, or, where the timer
    gives none, Jazzy, worked out as rcl's timer schedules), and the ticks a late timer missed.
    ``sim_time``: the timer follows /clock, whose jumps start the grid again (:meth:`_anchor`)
    instead of counting the time jumped over as missed ticks; :attr:`jump` says the last one."""

    def __init__(self, counters: collections.Counter, sim_time: bool = False):
        self._counters = counters
        self._sim_time = sim_time
        self._last_scheduled: Optional[int] = None
        self._last_actual: Optional[int] = None  # when the tick before was called
        #: (from, to) ns of the last clock jump that started the grid again, until the caller takes it
        self.jump: Optional[tuple[int, int]] = None

    def count(self, scheduled_ns: Optional[int], actual_ns: int, period: int) -> int:
        """The tick's scheduled time (counting the ticks missed before it)."""
        if scheduled_ns is None:  # rclpy without TimerInfo (Jazzy)
            scheduled_ns = self._rcl_next(actual_ns, period)
        if self._sim_time:
            scheduled_ns = self._anchor(scheduled_ns, actual_ns, period)
        if self._last_scheduled is not None and scheduled_ns - self._last_scheduled > period * 3 // 2:
            # rcl skips the ticks of a timer that is late by more than a period
            self._counters["missed_ticks"] += round((scheduled_ns - self._last_scheduled) / period) - 1
        self._last_scheduled, self._last_actual = scheduled_ns, actual_ns
        return scheduled_ns

    def _anchor(self, scheduled_ns: int, actual_ns: int, period: int) -> int:
        """``scheduled_ns``, unless the clock jumped (:data:`JUMP_PERIODS`) or the grid starts (the
        first tick, which has no tick before to be late against, called more than a period late):
        then the grid starts at this tick, the timer's last tick time before ``actual_ns``, and
        nothing before counts as missed. The first /clock (after ROS time 0: the timer was set
        before any /clock came) starts it so; :attr:`jump` tells only a jump from a clock reading."""
        late, first = actual_ns - scheduled_ns, self._last_actual is None
        jumped = (not first and actual_ns < self._last_actual) or late > max(JUMP_PERIODS * period, JUMP_MIN_NS)
        if not jumped and not (first and late > period):
            return scheduled_ns
        since = scheduled_ns - period if first else self._last_actual  # the timer's start, or the tick before
        if jumped and since > 0:
            self.jump = (since, actual_ns)
        self._last_scheduled = None
        if late < 0:  # back, on Jazzy: the tick worked out is the old clock's
            return actual_ns
        if late <= period:  # back, on Kilted: rcl's timer started again from the new time
            return scheduled_ns
        return actual_ns + (scheduled_ns - actual_ns) % period - period  # on the timer's grid, before the call

    def _rcl_next(self, actual_ns: int, period: int) -> int:
        """The tick this callback serves, as rcl's timer schedules: the one a period after the
        tick before (however late its callback comes), unless the callback before was itself
        called more than a period after its tick: then rcl skipped to the first tick after
        that call. The first callback starts the grid."""
        if self._last_scheduled is None:
            return actual_ns
        scheduled = self._last_scheduled + period
        if scheduled < self._last_actual:
            scheduled += (1 + (self._last_actual - scheduled) // period) * period
        return scheduled

    def rate_changed(self) -> None:
        """The control rate changed: the tick grid starts again."""
        self._last_scheduled = self._last_actual = None


class ActionOutput:
    """See the module doc. ``params``: the node's parameter values (read live:
    ``hold_action``, ``control_frame``, ``joint_names``); ``actions_topic`` and
    ``trajectory_topic``: this output's (a robot's); ``records``: where each chunk's first
    publication is noted (None: nowhere; the control process reports it back instead)."""

    def __init__(self, node, params: dict, counters: collections.Counter, records: Optional[FrameRecords], *,
                 actions_topic: str, trajectory_topic: str):
        self._params, self._counters, self._records = params, counters, records
        self.clock = ChunkClock()
        self._log = node.get_logger()
        self._pub_actions = node.create_publisher(ActionChunk, actions_topic, reliable(10))
        self._pub_traj = (node.create_publisher(JointTrajectory, trajectory_topic, reliable(10))
                          if params["joint_names"] else None)

    @property
    def topic(self) -> str:
        """The resolved ActionChunk topic."""
        return self._pub_actions.topic_name

    @property
    def subscribers(self) -> int:
        """The subscriptions the ActionChunk publisher has matched now (a controller listening)."""
        return self._pub_actions.get_subscription_count()

    def tick(self, scheduled_ns: int, stopped: bool, now_ns: int) -> Optional[Due]:
        """What the tick scheduled at ``scheduled_ns`` publishes, or None. ``stopped``: the
        action output is stopped; ``now_ns``: monotonic, for the frame records."""
        if stopped:  # repeated frame failures: no action output at all
            self.clock.ticks += 1
            self._counters["ticks_faulted"] += 1
            return None
        due = self.clock.tick(scheduled_ns)
        if due is not None and due.first and self._records is not None:
            self._records.published(due.chunk.frame_id, now_ns)
        if due is None and self.clock.chunk is not None and self._params["hold_action"] == "last":
            # an underrun (counted): repeat the last row, marked as a hold (offset = H, one row)
            c = self.clock.chunk
            due = Due(c, c.horizon, scheduled_ns, False)
            self._counters["hold_ticks"] += 1
        return due

    def push(self, chunk: Chunk) -> None:
        self.clock.push(chunk)

    def drop(self) -> None:
        """Drop the current chunk (the action output stops)."""
        self.clock.chunk = self.clock.origin_ns = None

    def counts(self) -> dict:
        """Control ticks so far: all, those that published, underruns, before the first chunk;
        ``first_ticks``: (observation stamp, tick time) of each recent chunk's first publication."""
        return self.clock.counts()

    def publish(self, due: Due) -> None:
        """The ActionChunk (and JointTrajectory) of ``due``. A failure is counted
        (``publish_errors``) and logged, not raised: one message never ends the control
        loop, nor another robot's publication in the same tick."""
        try:
            self._publish(due)
        except Exception as exc:
            self._counters["publish_errors"] += 1
            self._log.error(f"could not publish actions on {self.topic}: {exc!r}", throttle_duration_sec=5.0)

    def _publish(self, due: Due) -> None:
        c = due.chunk
        hold = due.offset >= c.horizon
        actions = c.actions[-1:] if hold else due.actions
        frame = self._params["control_frame"]
        msg = conversions.action_chunk_msg(
            conversions.ns_to_time_msg(due.stamp_ns), c.frame_id, c.observation_seq,
            conversions.ns_to_time_msg(c.observation_stamp_ns), due.offset, c.period_ns / NS_PER_S, actions,
            header_frame_id=frame)
        self._pub_actions.publish(msg)
        if self._pub_traj is not None and (len(actions) > 1 or c.horizon == 1):
            # one point would end when it starts, before it arrives: joint_trajectory_controller refuses such
            # a trajectory ("ends in the past", an ERROR each tick while a chunk's last row is held); it holds
            # the last point of the one before, which is this row
            names = self._params["joint_names"]
            self._pub_traj.publish(conversions.joint_trajectory_msg(
                msg.header.stamp, names, actions[:, :len(names)], c.period_ns / NS_PER_S, frame_id=frame))
        self._counters["actions_published"] += 1

"""The inference node's side of the control process: each robot's chunk out, its tick figures back.

With ``control_process: true`` (the default) the node starts
:mod:`.control_process` when it is configured, and that process publishes
every robot's ActionChunks (and JointTrajectories) on the exact tick grid, at
``control_priority``, away from the interpreter lock of the node's frames,
observations and diagnostics. The node keeps one :class:`RemoteOutput` per
robot where it would keep an :class:`~.action_output.ActionOutput`: the frame
worker pushes each chunk into it (it goes to the
:class:`~oxygen_ros.core.chunk_board.ChunkBoard`), and :meth:`ControlLink.sync`
brings back what the ticks did (:class:`~oxygen_ros.core.tick_board.TickBoard`):
every robot's counts, each chunk's first publication (the frame records'
publish time, ``first_ticks``) and every tick's lateness, so that
``/diagnostics``, ``tick_counts()`` and the agent's report read as they do with
the tick in the node's process.

The process ticks only while the node is active (:meth:`ControlLink.run`), takes
``control_rate_hz`` and ``hold_action`` changes on its next tick, ends with
the node (:meth:`ControlLink.stop`, or by itself when the node's process ends),
and a failure to start it leaves the node ticking in its own process, said once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Optional

from ..core.child_env import child_env
from ..core.chunk_board import ChunkBoard
from ..core.chunk_clock import COUNTS as CLOCK_COUNTS
from ..core.chunk_clock import Chunk, ChunkClock
from ..core.frame_records import FrameRecords
from ..core.stats import Rolling
from ..core.tick_board import READY, ROBOT_FIELDS, TickBoard

START_TIMEOUT_S = 60.0
_LEVELS = ("subscribers",)  # a value now, not a count


class ControlProcessError(RuntimeError):
    """The control process did not start."""


class RemoteOutput:
    """A robot's action output ticked by the control process: what the node reads of an
    :class:`~.action_output.ActionOutput` (``clock``, ``push``, ``drop``, ``counts``, ``topic``,
    ``subscribers``), with the ticks' figures brought back by :meth:`ControlLink.sync`."""

    def __init__(self, board: ChunkBoard, slot: int, counters, records: FrameRecords, topic: str):
        self._board, self._slot, self._counters, self._records = board, slot, counters, records
        self.topic = topic
        self.clock = ChunkClock()
        self.subscribers = 0  # matched by its ActionChunk publisher, as of the last sync
        self._seen = dict.fromkeys(ROBOT_FIELDS, 0)
        self._firsts_seen = 0

    def push(self, chunk: Chunk) -> None:
        self.clock.push(chunk)
        self._board.write(self._slot, chunk)

    def drop(self) -> None:
        """Drop the current chunk: the output stops (its ticks count as faulted)."""
        self.clock.chunk = self.clock.origin_ns = None
        self._board.write(self._slot, None)

    def counts(self) -> dict:
        return self.clock.counts()

    def take(self, ticks: TickBoard) -> None:
        """What the control process reported for this robot since the last call."""
        counts, origin, version = ticks.robot(self._slot)
        self.subscribers = counts["subscribers"]
        for key in ROBOT_FIELDS:
            if key in _LEVELS:
                continue
            new = counts[key] - self._seen[key]
            if key in CLOCK_COUNTS:  # mirrored on its ChunkClock; the others go to its counters
                setattr(self.clock, key, getattr(self.clock, key) + new)
            elif new:
                self._counters[key] += new
        self._seen = counts
        self._firsts_seen, rows = ticks.firsts_since(self._slot, self._firsts_seen)
        for frame_id, stamp, tick, mono in rows.tolist():
            self.clock.first_ticks.append((stamp, tick))
            self._records.published(frame_id, mono)
        if self.clock.chunk is not None and version == self._board.version(self._slot):
            self.clock.origin_ns = origin  # the newest chunk's, anchored by its first tick (chunk_origin frame_end)


class ControlLink:
    """See the module doc. ``node``: the inference node (its name, namespace, context and
    topic resolution); ``params``: its parameter values; ``topics``: each robot's
    ``(actions_topic, trajectory_topic)``, in the order :meth:`output` is asked for them."""

    def __init__(self, node, params: dict, topics: list[tuple[str, str]], horizon: int, action_dim: int):
        self._node, self._params, self._log = node, params, node.get_logger()
        self._topics = [[node.resolve_topic_name(t) for t in pair] for pair in topics]
        self.board = ChunkBoard(len(topics), horizon, action_dim)
        try:
            self.ticks = TickBoard(len(topics))
        except BaseException:  # Ctrl-C between the two: the first block is not left behind
            self.board.close()
            self.board.unlink()
            raise
        self.outputs: list[RemoteOutput] = []
        self._lateness_seen = self._missed_seen = 0
        self._process: Optional[subprocess.Popen] = None
        self._told_to_end = False  # terminate/stop: its end is no failure
        self._ticked_at = time.monotonic()
        self._epoch = 0  # activates so far (see run)

    def output(self, counters, records: FrameRecords, *, actions_topic: str, trajectory_topic: str) -> RemoteOutput:
        """The next robot's output (in the order of the board's slots), as RobotIO asks for it."""
        slot = len(self.outputs)
        if self._node.resolve_topic_name(actions_topic) != self._topics[slot][0]:
            raise ValueError(f"robot output {slot} on {actions_topic}, its control process slot is on "
                             f"{self._topics[slot][0]}")
        out = RemoteOutput(self.board, slot, counters, records, self._topics[slot][0])
        self.outputs.append(out)
        return out

    # ------------------------------------------------------------------ the process
    def start(self, period_ns: int) -> None:
        """Start the control process (paused until :meth:`run`); raises
        :class:`ControlProcessError` with the reason when it does not come up."""
        p, node = self._params, self._node
        self.ticks.set("period_ns", period_ns)
        self.set_hold(p["hold_action"])
        spec = {"board": self.board.name, "ticks": self.ticks.name, "horizon": self.board.horizon,
                "action_dim": self.board.action_dim, "period_ns": int(period_ns), "priority": p["control_priority"],
                "node": node.get_name(), "namespace": node.get_namespace(), "domain_id": node.context.get_domain_id(),
                "params": {k: p[k] for k in ("hold_action", "control_frame", "joint_names")}, "robots": self._topics,
                "parent": os.getpid()}
        fd, path = tempfile.mkstemp(prefix="oxygen_control_", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(spec, f)
        try:
            self._process = subprocess.Popen([sys.executable, "-m", "oxygen_ros.ros.control_process", path],
                                             env=child_env(),
                                             stdout=subprocess.DEVNULL)
            deadline = time.monotonic() + START_TIMEOUT_S
            while self.ticks.get("state") != READY:
                code = self._process.poll()
                if code is not None:
                    raise ControlProcessError(f"the control process exited with code {code} at start "
                                              "(its error is above)")
                if time.monotonic() > deadline:
                    self.stop()
                    raise ControlProcessError(f"the control process was not ready within {START_TIMEOUT_S:.0f} s")
                time.sleep(0.01)
        finally:
            os.unlink(path)
        self._log.info(f"control tick: in its own process (pid {self._process.pid}, node "
                       f"{node.get_name()}_control), {len(self._topics)} robot(s)")

    def run(self, running: bool) -> None:
        """Tick (the node is active) or not. Each activate writes a new number (its epoch), so
        that the process knows an activate even when it never saw the pause between."""
        if running:
            self._epoch += 1
        self.ticks.set("running", self._epoch if running else 0)
        self._ticked_at = time.monotonic()  # the silence is counted from here (see silent_s)

    def silent_s(self) -> float:
        """Seconds since the control process last ticked, as of the last :meth:`sync`, while it
        should tick (0 when paused): a process stopped (SIGSTOP), deadlocked or starved of
        CPU neither ticks nor exits, and counts no underrun either."""
        return time.monotonic() - self._ticked_at if self.ticks.get("running") else 0.0

    def set_period(self, period_ns: int) -> None:
        self.ticks.set("period_ns", period_ns)

    def set_hold(self, hold_action: str) -> None:
        self.ticks.set("hold_last", int(hold_action == "last"))

    @property
    def pid(self) -> Optional[int]:
        return None if self._process is None else self._process.pid

    @property
    def failure(self) -> Optional[str]:
        """Why the control process is gone (None while it runs, before it started, or once it was
        told to end: a shutdown's end is no failure, while the node is still active in it)."""
        code = None if self._process is None else self._process.poll()
        if code is None or self._told_to_end:
            return None
        return (f"the control process was killed by signal {-code}" if code < 0
                else f"the control process exited with code {code}")

    def sync(self, lateness: Rolling, counters) -> None:
        """Bring back what the ticks did since the last call (the node's lock held): each
        robot's figures, every tick's lateness (into ``lateness``, ms) and the missed ticks."""
        for out in self.outputs:
            out.take(self.ticks)
        self._lateness_seen, values = self.ticks.lateness_since(self._lateness_seen)
        if len(values):
            self._ticked_at = time.monotonic()
        for ms in values.tolist():
            lateness.add(ms)
        missed = self.ticks.get("missed_ticks")
        if missed > self._missed_seen:
            counters["missed_ticks"] += missed - self._missed_seen
            self._missed_seen = missed

    def terminate(self) -> None:
        """Tell the control process to end (SIGTERM), without waiting for it."""
        proc = self._process
        if proc is not None and proc.poll() is None:
            self._told_to_end = True
            proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 5.0) -> None:
        """End the control process (SIGTERM; SIGKILL after ``timeout``). Again: nothing."""
        proc = self._process
        if proc is None or proc.poll() is not None:
            return
        self._told_to_end = True
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        """:meth:`stop`, then free the shared memory."""
        self.stop()
        for block in (self.board, self.ticks):
            block.close()
            block.unlink()


__all__ = ["ControlLink", "ControlProcessError", "RemoteOutput"]

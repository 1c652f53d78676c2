"""The control tick in a process of its own: every robot's chunk clock and action publishers.

A tick that shares the inference node's process waits for the interpreter
lock whenever another of that process's threads holds it (docs/control_loop_timing.md, "Where
the last milliseconds go": 2.0-2.9 ms at p99 with four robots). This process holds
nothing else: it reads each robot's newest chunk from the
:class:`~oxygen_ros.core.chunk_board.ChunkBoard` the frame worker writes,
and on an exact grid of the system clock (:class:`.control_thread.ControlThread`,
``SCHED_FIFO`` at ``priority``) publishes each robot's due actions, as the node's
own tick does (:class:`.action_output.ActionOutput`: offsets, stamps, holds).
The whole process runs at that priority, the middleware's threads too (set
before rclpy starts them): a middleware thread at normal priority that holds
a lock a publication needs would wait behind the frames for a core.
It ends on SIGINT or SIGTERM, or by itself within 0.1 s of its parent's end::

    python -m oxygen_ros.ros.control_process SPEC.json

``SPEC.json``: ``board`` and ``ticks`` (the two blocks' names: the chunks in,
the :class:`~oxygen_ros.core.tick_board.TickBoard` back), ``horizon``,
``action_dim``, ``period_ns``, ``priority``, ``node`` and ``namespace`` (this
process's node is ``<node>_control``), ``domain_id``, ``params``
(``hold_action``, ``control_frame``, ``joint_names``) and ``robots``: one
``[actions_topic, trajectory_topic]`` per board slot, in slot order. Once its
publishers exist it marks the tick board ready and prints :data:`READY`.

It ticks while the tick board says ``running`` (the node is active), takes the
board's ``period_ns`` and ``hold_last`` on every tick, and writes back each
robot's counts, each chunk's first publication and every tick's lateness.
A robot whose slot the node emptied (its output stopped after failed frames)
counts its ticks as faulted until a chunk comes again. The node's side:
:mod:`.control_link`.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import rclpy
from rclpy.node import Node
from rclpy.signals import SignalHandlerOptions

from ..core.chunk_board import ChunkBoard, TornRead
from ..core.tick_board import READY as BOARD_READY
from ..core.tick_board import TickBoard
from .action_output import ActionOutput, TickGrid
from .control_thread import ControlThread
from .process import realtime_priority, settle_garbage_collector

READY = "control process ready"
#: what ActionOutput counts in its counters (the rest of the tick board's robot fields are its clock's)
_COUNTED = ("hold_ticks", "ticks_faulted", "actions_published", "publish_errors")


class ControlProcess:
    """The process's node, one action output per board slot, and the tick over them."""

    def __init__(self, spec: dict[str, Any]):
        self.node = Node(f"{spec['node']}_control", namespace=spec.get("namespace", "/"),
                         start_parameter_services=False, enable_rosout=False)
        robots = len(spec["robots"])
        self.board = ChunkBoard(robots, spec["horizon"], spec["action_dim"], name=spec["board"])
        self.report = TickBoard(robots, name=spec["ticks"])
        self.params = dict(spec["params"])  # hold_action follows the tick board's hold_last
        self.counters = [collections.Counter() for _ in range(robots)]
        self.outputs = [ActionOutput(self.node, self.params, counters, None, actions_topic=actions,
                                     trajectory_topic=trajectory)
                        for (actions, trajectory), counters in zip(spec["robots"], self.counters)]
        self._versions = [0] * robots
        self._stopped = [False] * robots  # the node stopped the robot's output (its slot holds no chunk)
        self._epoch = 0  # the node's activate it ticks for (0: paused)
        self._missed: collections.Counter = collections.Counter()
        self._grid = TickGrid(self._missed)
        self.control = ControlThread(self.node, spec["period_ns"], self._tick, spec["priority"], self.node.get_logger())

    def _tick(self, scheduled_ns: int, actual_ns: int) -> None:
        epoch = self.report.get("running")
        if not epoch:  # the node is not active: no tick, none counted missed
            self._grid.rate_changed()
            self._epoch = 0
            return
        if epoch != self._epoch:  # activated (seen paused or not): nothing held from before goes out
            self._activated(epoch)
        now = time.monotonic_ns()
        period = self.report.get("period_ns") or self.control.period_ns
        if period != self.control.period_ns:  # control_rate_hz changed: from the next tick on
            self.control.period_ns = period
            self._grid.rate_changed()
        self.params["hold_action"] = "last" if self.report.get("hold_last") else "none"
        self._grid.count(scheduled_ns, actual_ns, period)
        dues = []
        for slot, output in enumerate(self.outputs):
            if self.board.version(slot) != self._versions[slot]:
                self._take(slot, output)
            dues.append(output.tick(scheduled_ns, self._stopped[slot], now))
        for output, due in zip(self.outputs, dues):
            if due is not None:
                output.publish(due)
        self._report(dues, scheduled_ns, actual_ns, now)

    def _activated(self, epoch: int) -> None:
        """Every output starts empty: the node emptied the slots at deactivate, and what it pushed
        since is taken; a slot read torn now is read on the next tick. They wait for their next
        chunk (``waiting`` till then), not stopped."""
        self._epoch = epoch
        for slot, output in enumerate(self.outputs):
            output.drop()
            if self.board.version(slot) != self._versions[slot]:
                self._take(slot, output)
        self._stopped = [False] * len(self._stopped)

    def _take(self, slot: int, output: ActionOutput) -> None:
        try:
            self._versions[slot], chunk = self.board.read(slot)
        except TornRead:
            return  # keep the chunk it had; the next tick reads again
        self._stopped[slot] = chunk is None
        if chunk is None:
            output.drop()
        else:
            output.push(chunk)

    def _report(self, dues: list, scheduled_ns: int, actual_ns: int, now: int) -> None:
        """Everything the node reads back (:class:`~oxygen_ros.core.tick_board.TickBoard`)."""
        for slot, (output, due) in enumerate(zip(self.outputs, dues)):
            if due is not None and due.first:
                c = due.chunk
                self.report.add_first(slot, c.frame_id, c.observation_stamp_ns, scheduled_ns, now)
            counts = output.clock.counts(first_ticks=False)  # no copy of its first publications every tick
            counts.update((key, self.counters[slot][key]) for key in _COUNTED)
            counts["subscribers"] = output.subscribers
            self.report.write_robot(slot, counts, output.clock.origin_ns, self._versions[slot])
        self.report.set("missed_ticks", self._missed["missed_ticks"])
        self.report.add_lateness((actual_ns - scheduled_ns) / 1e6)

    def close(self) -> None:
        self.control.destroy()
        self.board.close()
        self.report.close()
        self.node.destroy_node()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m oxygen_ros.ros.control_process SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(args[0]).read_text())
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    realtime_priority(spec["priority"])  # before rclpy starts its threads: they inherit it (a refusal:
    # the control thread asks again and says why)
    rclpy.init(args=[], domain_id=spec.get("domain_id"), signal_handler_options=SignalHandlerOptions.NO)
    parent = spec.get("parent", os.getppid())  # the node's pid: a node gone before this line is seen
    if os.getppid() != parent:
        return 1  # the node ended while this process started: nothing to tick for
    process = ControlProcess(spec)
    try:
        settle_garbage_collector()  # a full collection here would hold a tick for about 20 ms
        process.control.start()
        process.report.set("state", BOARD_READY)
        print(READY, flush=True)
        while not stop.wait(0.1) and os.getppid() == parent and process.control.alive:
            pass
        return 1 if process.control.failure else 0
    finally:
        process.close()
        rclpy.try_shutdown()


if __name__ == "__main__":
    sys.exit(main())

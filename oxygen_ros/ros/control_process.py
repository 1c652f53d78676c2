"""The control tick in a process of its own: every robot's chunk clock and action publishers.

A tick that shares the inference node's process waits for the interpreter
lock whenever another of that process's threads holds it (README, "Where the
last milliseconds go": 2.0-2.9 ms at p99 with four robots). This process holds
nothing else: it reads each robot's newest chunk from the
:class:`~oxygen_ros.core.chunk_board.ChunkBoard` the frame worker writes,
and on an exact grid of the system clock (:class:`.control_thread.ControlThread`,
``SCHED_FIFO`` at ``priority``) publishes each robot's due actions, as the node's
own tick does (:class:`.action_output.ActionOutput`: offsets, stamps, holds).
It ends on SIGINT or SIGTERM, or by itself within 0.1 s of its parent's end::

    python -m oxygen_ros.ros.control_process SPEC.json

``SPEC.json``: ``board`` (the block's name), ``horizon``, ``action_dim``,
``period_ns``, ``priority``, ``node`` and ``namespace`` (this process's node is
``<node>_control``), ``params`` (``hold_action``, ``control_frame``,
``joint_names``) and ``robots``: one ``[actions_topic, trajectory_topic]``
per board slot, in slot order. It prints :data:`READY` once its publishers exist.

Not wired into the inference node yet: what is left is the way back (ticks,
underruns, holds, first publications and lateness for ``/diagnostics``), the
"stopped" state of a robot's output, rate changes and simulated time.
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
from ..core.frame_records import FrameRecords
from .action_output import ActionOutput
from .control_thread import ControlThread

READY = "control process ready"


class ControlProcess:
    """The process's node, one action output per board slot, and the tick over them."""

    def __init__(self, spec: dict[str, Any]):
        self.node = Node(f"{spec['node']}_control", namespace=spec.get("namespace", "/"),
                         start_parameter_services=False, enable_rosout=False)
        self.board = ChunkBoard(len(spec["robots"]), spec["horizon"], spec["action_dim"], name=spec["board"])
        self.counters: collections.Counter = collections.Counter()
        self.outputs = [ActionOutput(self.node, spec["params"], self.counters, FrameRecords(1000),
                                     actions_topic=actions, trajectory_topic=trajectory or "")
                        for actions, trajectory in spec["robots"]]
        self._versions = [0] * len(self.outputs)
        self.control = ControlThread(self.node, spec["period_ns"], self._tick, spec["priority"], self.node.get_logger())

    def _tick(self, scheduled_ns: int, actual_ns: int) -> None:
        now = time.monotonic_ns()  # ActionOutput's frame records count on the monotonic clock
        dues = []
        for slot, output in enumerate(self.outputs):
            if self.board.version(slot) != self._versions[slot]:
                try:
                    self._versions[slot], chunk = self.board.read(slot)
                except TornRead:
                    pass  # keep the chunk it had; the next tick reads again
                else:
                    if chunk is None:
                        output.drop()
                    else:
                        output.push(chunk)
            dues.append(output.tick(scheduled_ns, False, now))
        for output, due in zip(self.outputs, dues):
            if due is not None:
                output.publish(due)

    def close(self) -> None:
        self.control.destroy()
        self.board.close()
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
    rclpy.init(args=[], signal_handler_options=SignalHandlerOptions.NO)
    parent = os.getppid()
    process = ControlProcess(spec)
    try:
        process.control.start()
        print(READY, flush=True)
        while not stop.wait(0.1) and os.getppid() == parent and process.control.alive:
            pass
        return 1 if process.control.failure else 0
    finally:
        process.close()
        rclpy.try_shutdown()


if __name__ == "__main__":
    sys.exit(main())

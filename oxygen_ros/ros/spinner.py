"""Spinning the agent's nodes in one process: a :class:`Spinner` runs each node (or all,
``multi``) on an executor of its own in a background thread, off the control path at
a lower CPU priority, and tells which executor stopped and why."""

from __future__ import annotations

import sys
import threading
import traceback

from .process import lower_thread_priority

EXECUTORS = ("split", "multi")


#: The nodes on the path camera -> observation -> frame -> ActionChunk. In the
#: ``split`` layout every other node (the synthetic camera or bag player, the
#: command's own nodes) spins on a thread of lower CPU priority (``--background-niceness``).
CONTROL_PATH = ("oxygen_camera", "oxygen_inference")
BACKGROUND_NICENESS = 10


class Spinner:
    """Spins ``nodes`` in background threads (so that the main thread only prints
    and waits for Ctrl-C), with the executor layout ``mode`` (``--executor``).

    ``split`` (default): one ``SingleThreadedExecutor`` and thread per node. The
    threads of nodes off the control path (:data:`CONTROL_PATH`) lower their own
    scheduling priority by ``background_niceness`` (Linux, where a thread has a
    niceness of its own; 0 leaves it): on a machine with few cores, the demo
    source and the status monitor then wait for a free core instead of taking it
    from the control tick, the observation hand-off or a controller in another
    process at the moments all of them wake together (every ActionChunk wakes the
    synthetic camera's subscriber too). Raising niceness needs no privilege."""

    def __init__(self, mode: str, nodes: list, background_niceness: int = BACKGROUND_NICENESS):
        from rclpy.executors import MultiThreadedExecutor, SingleThreadedExecutor

        if mode not in EXECUTORS:
            raise ValueError(f"executor layout {mode!r}: expected one of {EXECUTORS}")
        if mode == "multi":
            groups = [(MultiThreadedExecutor(num_threads=4), list(nodes))]
        else:  # split: the control tick (and the measuring subscriber) never wait behind other nodes' callbacks
            groups = [(SingleThreadedExecutor(), [node]) for node in nodes]
        self.executors = []
        self.threads = []
        for executor, members in groups:
            for node in members:
                executor.add_node(node)
            niceness = 0
            if (mode != "multi" and background_niceness > 0 and sys.platform.startswith("linux")
                    and not any(n.get_name() in CONTROL_PATH for n in members)):
                niceness = background_niceness
            names = ", ".join(n.get_name() for n in members)
            thread = threading.Thread(target=self._spin, args=(executor, names, niceness), daemon=True,
                                      name=f"oxygen-agent-{type(executor).__name__}")
            self.executors.append(executor)
            self.threads.append(thread)
        self.failure: str | None = None  # which executor stopped on an error, and the error
        for thread in self.threads:
            thread.start()

    def _spin(self, executor, names: str, niceness: int = 0) -> None:
        from rclpy.executors import ExternalShutdownException

        why = lower_thread_priority(niceness)
        if why:  # run at normal priority
            print(f"oxygen-agent: could not lower a background thread's priority: {why}", file=sys.stderr)
        try:
            executor.spin()
        except ExternalShutdownException:
            pass
        except BaseException as exc:  # reported by alive() and failure
            self.failure = f"{names} stopped: {exc!r}"
            traceback.print_exc()

    def alive(self) -> bool:
        """Every executor still spins."""
        return self.failure is None and all(t.is_alive() for t in self.threads)

    def shutdown(self) -> None:
        for executor in self.executors:
            executor.shutdown()
        for thread in self.threads:
            thread.join(5.0)

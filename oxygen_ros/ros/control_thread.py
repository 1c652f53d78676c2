"""The control tick's own thread: a clock that nothing else in the process waits behind.

The inference node's executor serves its subscriptions (an observation's
conversion), the Ask action servers, the parameter services and the
diagnostics (a few ms once a second with several robots); a tick falling due
while one of those runs would wait for it. So the control tick runs on a
thread of its own, started and stopped with the node's timers, which calls
``on_tick(scheduled_ns, actual_ns)`` (ROS time of the node's clock) every
period. The control process (:mod:`.control_process`, the node's default)
runs the same thread over its own outputs; the node runs it in its own
process with ``control_process: false`` or ``use_sim_time``:

* **System clock** (the usual case): the ticks' scheduled times are an
  exact grid on the node's clock (a chunk anchored at one tick counts its
  rows in whole periods from it); the thread sleeps until each and ticks. A
  tick due while the one before was still running by more than half a
  period is skipped, as rcl skips a late timer's (the node counts them as
  missed); a clock set back by more than two periods starts the grid again. rclpy's executor would add
  its own Python bookkeeping to every wake-up: measured on the tiny demo
  with four robots, the tick started 0.25-0.40 ms after its due time at the
  median on an rclpy timer, 0.08-0.10 ms on this clock.
* **Simulated time** (``use_sim_time``): an rclpy timer on a small companion
  node, ``<node>_control`` (no parameter services, no rosout), spun by an
  executor of its own on this thread, so that the ticks follow ``/clock``.

Priority: the thread asks Linux for the real-time policy ``SCHED_FIFO`` at
``control_priority`` (as ros2_control's controller manager does for its
control loop), so that it takes a core from the frames, the camera side and
the middleware's helper threads the moment it wakes. Where that is not
allowed (no ``CAP_SYS_NICE`` and no ``rtprio`` limit) it says why once and
runs at normal priority. 0: never ask.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, Optional

from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter

from ..core.chunk_clock import NS_PER_S
from .process import realtime_priority

try:  # rclpy of Kilted passes the timer's scheduled time to callbacks that ask for it
    from rclpy.timer import TimerInfo
except ImportError:  # Jazzy's rclpy (7.1) has no TimerInfo: ActionOutput rounds to the tick grid
    TimerInfo = None


def uses_sim_time(node: Node) -> bool:
    """The node's clock follows ``/clock`` (its ``use_sim_time`` parameter)."""
    return node.has_parameter("use_sim_time") and bool(node.get_parameter("use_sim_time").value)


def timer_callback(on_tick: Callable, now_ros: Callable[[], int]) -> Callable:
    """``on_tick(scheduled_ns, actual_ns)`` as an rclpy timer callback (scheduled None without
    TimerInfo). rclpy passes a TimerInfo to a callback whose argument is annotated with the
    class itself (not a string, which is why the annotation is set here, not written)."""
    if TimerInfo is not None:
        def tick(info) -> None:
            on_tick(info.expected_call_time.nanoseconds, info.actual_call_time.nanoseconds)

        tick.__annotations__ = {"info": TimerInfo, "return": None}
    else:  # Jazzy: no TimerInfo
        def tick() -> None:
            on_tick(None, now_ros())
    return tick


class ControlThread:
    """Calls ``on_tick(scheduled_ns, actual_ns)`` every ``period_ns`` on a thread of its
    own (see the module doc). ``owner``: the inference node (its clock; with sim time
    its name, namespace and context for the companion node); ``log``: its logger.
    :meth:`start` once; :meth:`stop` ends the thread, :meth:`destroy` the companion
    node too."""

    def __init__(self, owner: Node, period_ns: int, on_tick: Callable[[int | None, int], None], priority: int,
                 log: Any):
        self._owner, self._on_tick, self._priority, self._log = owner, on_tick, priority, log
        self._period_ns = int(period_ns)
        self._stopping = threading.Event()
        self.priority_error: Optional[str] = None  # why the real-time priority was refused
        self.failure: Optional[str] = None  # the error that stopped the thread
        self.node: Optional[Node] = None
        self._timer = self._executor = None
        if uses_sim_time(owner):  # ticks follow /clock: an rclpy timer on a node of this thread's own
            self.node = Node(f"{owner.get_name()}_control", namespace=owner.get_namespace(), context=owner.context,
                             start_parameter_services=False, enable_rosout=False,
                             parameter_overrides=[Parameter("use_sim_time", Parameter.Type.BOOL, True)])
            self._timer = self.node.create_timer(
                period_ns / NS_PER_S, timer_callback(on_tick, lambda: owner.get_clock().now().nanoseconds))
            self._executor = SingleThreadedExecutor(context=owner.context)
            self._executor.add_node(self.node)
        self._thread = threading.Thread(target=self._run, name="oxygen-inference-control", daemon=True)

    @property
    def period_ns(self) -> int:
        return self._period_ns

    @period_ns.setter
    def period_ns(self, value: int) -> None:
        """A new period: the next tick is due one new period after the last one."""
        self._period_ns = int(value)
        if self._timer is not None:
            self._timer.timer_period_ns = self._period_ns

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def stopped(self) -> bool:
        """:meth:`stop` was called: no tick starts any more."""
        return self._stopping.is_set()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """No tick starts any more; the one in flight completes. Again (after :meth:`destroy`
        too): it waits for the thread, nothing else."""
        first = not self._stopping.is_set()
        self._stopping.set()
        if first and self._timer is not None:
            self._timer.cancel()
            self._executor.shutdown(timeout_sec=timeout)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def destroy(self) -> None:
        """:meth:`stop`, then destroy the companion node (sim time). Again: nothing."""
        self.stop()
        node, self.node, self._timer = self.node, None, None
        if node is not None:
            try:
                node.destroy_node()
            except Exception:  # noqa: BLE001  the context is gone already (Ctrl-C): so is the node
                pass

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        self.priority_error = realtime_priority(self._priority)
        if self.priority_error:
            self._log.warning(f"control_priority {self._priority}: the control tick runs at normal priority: "
                              f"{self.priority_error}")
        try:
            if self._executor is not None:
                self._executor.spin()
            else:
                self._tick_on_system_clock()
        except ExternalShutdownException:
            pass
        except BaseException as exc:  # reported by the node (control_failure) and the agent
            self.failure = repr(exc)
            self._log.error(f"control tick stopped: {exc!r}\n{traceback.format_exc()}")

    def _tick_on_system_clock(self) -> None:
        """Ticks on an exact grid of the node's clock (what the chunk clock's offsets count
        on), each slept to on the steady clock."""
        clock = self._owner.get_clock()
        due = clock.now().nanoseconds + self._period_ns
        while not self._stopping.is_set():
            period = self._period_ns
            wait = due - clock.now().nanoseconds
            if wait > 2 * period:  # the clock was set back: the grid starts again from now
                due = clock.now().nanoseconds + period
                continue
            if wait > 0:
                time.sleep(wait / NS_PER_S)
                if self._stopping.is_set():
                    return
            self._on_tick(due, clock.now().nanoseconds)
            due += self._period_ns  # a new period counts from the last tick
            behind = clock.now().nanoseconds - due
            if behind > period // 2:  # skip the ticks this one overran (the node counts them missed)
                due += (behind // period + 1) * period

"""Process-wide set-up shared by every entry point that runs the control loop.

``inference_node`` (``ros2 run``), ``oxygen-agent`` and ``oxygen-soak`` start
their process with :func:`init_control_process`, call
:func:`settle_garbage_collector` once their nodes exist (the inference node
has called it already, after its warm-up), and the node's own
``main`` checks at exit that no thread was left running
(:func:`report_leftover_threads`).
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading

import rclpy
from rclpy.signals import SignalHandlerOptions

from ..core.interrupts import record_interrupt
from ..core.signal_delivery import raise_not_lost, redelivered_after_finalizer
from ..core.tick_guard import SWITCH_INTERVAL_S


def report_leftover_threads(name: str, out=sys.stderr) -> list:
    """Threads still running at exit besides the main thread (none expected: the
    worker and the executor threads are stopped); printed after ``name:``, and returned."""
    left = [t for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive()]
    if left:
        print(f"{name}: threads still running at exit: {[t.name for t in left]}", file=out)
    return left


def lower_thread_priority(niceness: int) -> str | None:
    """Raise the calling thread's niceness by ``niceness`` (Linux, where a thread has a
    niceness of its own: its id is a process id for setpriority; raising it needs no
    privilege); capped at 19. Returns None, or why it could not (the thread then keeps
    its priority)."""
    if niceness <= 0:
        return None
    if not sys.platform.startswith("linux"):
        return f"a thread's own niceness is Linux only (this is {sys.platform})"
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + niceness))
    except OSError as exc:  # a sandbox may forbid it
        return str(exc)
    return None


def realtime_priority(priority: int) -> str | None:
    """Put the calling thread under ``SCHED_FIFO`` at ``priority`` (Linux; the threads it starts
    afterwards inherit it); None, or why not (the thread keeps its policy). 0: nothing."""
    if priority <= 0:
        return None
    if not hasattr(os, "sched_setscheduler") or not sys.platform.startswith("linux"):
        return f"real-time scheduling is Linux only (this is {sys.platform})"
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))  # 0: the calling thread
    except (OSError, ValueError) as exc:  # EPERM without CAP_SYS_NICE or an rtprio limit
        return (f"{exc}; allow it with an rtprio limit for this user (/etc/security/limits.conf: "
                f"'<user> - rtprio {priority}') or CAP_SYS_NICE")
    return None


def settle_garbage_collector() -> None:
    """After start-up: collect once, then move every object alive now (model,
    compiled graphs, modules, libraries) out of the collector's reach. A full
    collection of a process holding torch, its compiler and rclpy otherwise
    pauses every thread for 200-500 ms every few seconds during the start
    (measured with four robots, compiled), and the collection that this call
    makes takes as long: make it before the first control tick. The inference
    node calls it at the end of configure (after the warm-up; cleanup and
    destroy_node undo it, :func:`thaw_garbage_collector`), the control process
    before its first tick, and the process entry points again once their nodes
    exist (cheap by then)."""
    gc.collect()
    gc.freeze()


def thaw_garbage_collector() -> None:
    """Undo :func:`settle_garbage_collector`: the frozen objects go back to the collector.
    A frozen object is never freed, whatever refers to it: a node's model (its engine sits
    in reference cycles, and with it the KV pool) or its context (and with it its DDS
    participant) would outlive the node."""
    gc.unfreeze()


def init_control_process(args=None, sigint_once: bool = False) -> None:
    """Set up a process that runs the inference node's control loop: the worker's Python
    code hands the interpreter lock over every 1 ms (so it never holds it through a
    tick), SIGTERM ends the process like Ctrl-C, and rclpy starts without its own signal
    handlers (shutdown is ours: requests are cancelled first). ``sigint_once``: see
    :func:`install_sigterm_as_keyboard_interrupt`."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    install_sigterm_as_keyboard_interrupt(sigint_once)
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)


def ignore_further_interrupts() -> None:
    """From here on, SIGINT does nothing: called when a node's process starts closing. Ctrl-C
    in the terminal of a ``ros2 launch`` reaches every process of it, and the launch then
    forwards its own SIGINT, which would otherwise interrupt the clean-up half way (the
    control process not waited for, its shared memory not unlinked). SIGTERM still ends
    it: launch sends it only when a process has not ended 5 s after SIGINT."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def install_sigterm_as_keyboard_interrupt(sigint_once: bool = False) -> None:
    """Make SIGINT (Ctrl-C, and what launch sends first) and SIGTERM (sent by launch after
    SIGINT, and by `kill`) end the process with a KeyboardInterrupt. SIGINT is set too
    because a process started from a background job inherits it ignored, and would
    then wait for launch's SIGTERM, seconds later. A signal that comes while a finalizer
    runs is delivered again just after (:func:`interrupt`). With ``sigint_once`` the
    SIGINT that interrupts also turns SIGINT off, in the handler itself: a second one
    (launch forwards its own after the terminal's) cannot land in the clean-up before
    :func:`ignore_further_interrupts` runs."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, interrupt_once if sigint_once else interrupt)
        signal.signal(signal.SIGTERM, interrupt)


def interrupt(signum, frame) -> None:
    """Raise KeyboardInterrupt where the main thread is. One that comes inside a finalizer is
    sent again just after it (``signal_delivery.py``): Python drops an exception raised there
    and the process would go on, as a node did when a SIGINT landed in a ``Popen.__del__``
    that the garbage collector ran during its start."""
    if redelivered_after_finalizer(signum, frame):
        return
    record_interrupt()
    raise_not_lost(signum, KeyboardInterrupt())


def interrupt_once(signum, frame) -> None:
    """:func:`interrupt`, and SIGINT ignored from the moment it raises (handlers run on
    the main thread, between two bytecodes: nothing of the clean-up has run yet)."""
    if redelivered_after_finalizer(signum, frame):
        return
    ignore_further_interrupts()
    record_interrupt()
    # SIGINT is off by now: dropped in a finalizer, the interrupt comes again as SIGTERM (the same)
    raise_not_lost(signum, KeyboardInterrupt(), again=signal.SIGTERM)


def destroy_after_interrupt(destroy, tries: int = 100) -> None:
    """Run ``destroy`` (rclpy's ``Node.destroy_node`` of a node) to its end, even when the
    node was built while a KeyboardInterrupt came. rclpy's ``create_publisher`` and
    ``create_subscription`` add the entity to the node's list, then wake the executor, then
    add its event handlers: an interrupt raised in between (a Ctrl-C while the node starts)
    leaves an entity whose handlers were never added. rclpy's destroy takes it off the list,
    then raises ValueError removing them, and the node's other entities are left. Each call
    gets past one such entity (it is left to the garbage collector); the next goes on."""
    for _ in range(tries - 1):
        try:
            return destroy()
        except ValueError:
            continue
    destroy()

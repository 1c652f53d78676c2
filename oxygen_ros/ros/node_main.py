"""The ``main()`` of a node's executable: init, build, spin, shut down cleanly."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable

import rclpy
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor

from ..core.interrupts import honour_interrupts
from .node_help import NodeHelp, print_help_if_asked
from .parameters import ParameterError
from .process import ignore_further_interrupts, init_control_process, report_leftover_threads, settle_garbage_collector


def _initialised(init: Callable) -> bool:
    """Run ``init`` (rclpy's); False, with rcl's reason printed, when rcl refuses the process's
    arguments (a parameters file that cannot be parsed): the same exit status as a bad parameter,
    which a launch's respawn does not retry for ever."""
    from rclpy._rclpy_pybind11 import RCLError

    try:
        init()
    except RCLError as exc:
        print(f"cannot start with these arguments: {exc}", file=sys.stderr, flush=True)
        return False
    return True


def mark_logged(exc: BaseException) -> None:
    """``exc`` is in the node's log already (its FATAL line, with the cause): ``main`` does not
    print it again."""
    exc.oxygen_logged = True


def logged(exc: BaseException) -> bool:
    return getattr(exc, "oxygen_logged", False)


def run_node(make_node: Callable, args: list[str] | None = None, until_done: bool = False,
             about: NodeHelp | None = None) -> int:
    """Init rclpy, build the node, spin it (until ``node.done`` when asked), destroy it;
    Ctrl-C and an external shutdown end it quietly. 2 when a parameter is bad (the node
    has logged which: the status of every node's executable and of ``oxygen-agent``) or rcl
    refuses the arguments (a parameters file it cannot parse), else 0. ``--help``: ``about``
    printed, nothing started."""
    if print_help_if_asked(about, args):
        return 0
    # rclpy.init() is a context manager from Kilted on; Jazzy's returns None: init and shut down by hand
    if not _initialised(lambda: rclpy.init(args=args)):
        return 2
    try:
        try:
            with honour_interrupts():  # a Ctrl-C while it starts, even one a library swallowed
                node = make_node()
        except ParameterError:
            return 2  # logged by the node
        try:
            if until_done:
                rclpy.spin_until_future_complete(node, node.done)
            else:
                rclpy.spin(node)
        finally:
            ignore_further_interrupts()
            node.destroy_node()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        rclpy.try_shutdown()
    return 0


def run_control_node(make_node: Callable, name: str, args: list[str] | None = None,
                     about: NodeHelp | None = None) -> int:
    """The ``main()`` of a node on the control path (the inference node): the process set-up
    of :func:`.process.init_control_process`, the node built, the start-up garbage frozen, a
    single-threaded executor spun (every callback is short: the frames run on the node's
    worker thread, and rclpy's MultiThreadedExecutor spends most of a core rebuilding its
    wait set). A lifecycle node's ``shutdown`` transition (``finalized``) ends the process
    too, once the transition's answer is out: a finalized node publishes nothing and takes no
    transition any more, and a launch (every node required) then ends instead of running on
    without actions. Exit status: 2 for a bad parameter, 1 for any other failure (a model that
    does not load, a fault outside the frames: printed with its cause, unless the node logged
    it (:func:`mark_logged`); a transition that raised and finalized the node), else 0.
    ``--help``: ``about`` printed, nothing started."""
    if print_help_if_asked(about, args):
        return 0
    if not _initialised(lambda: init_control_process(args, sigint_once=True)):  # a second SIGINT (launch's)
        return 2  # never cuts the clean-up
    node = executor = None
    code = 0
    try:
        with honour_interrupts():  # a Ctrl-C while it starts, even one a library swallowed
            node = make_node()
        settle_garbage_collector()
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        while rclpy.ok() and not getattr(node, "finalized", False):
            executor.spin_once(timeout_sec=0.1)
        if rclpy.ok():  # finalized: the transition's answer (and the last messages) go out first
            code = _finalized(node, executor)
    except ParameterError as exc:
        if not logged(exc):
            print(f"{name}: {exc}", file=sys.stderr)
        code = 2
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except Exception as exc:
        if not logged(exc):
            print(f"{name}: {exc!r}\n{traceback.format_exc()}", file=sys.stderr)
        code = 1
    finally:
        ignore_further_interrupts()
        if node is not None:
            node.destroy_node()
        if executor is not None:
            executor.shutdown(timeout_sec=1.0)
        rclpy.try_shutdown()
    report_leftover_threads(name)
    return code


def _finalized(node, executor, linger_s: float = 0.3) -> int:
    """Spin ``linger_s`` more, say why the process ends; 1 when a failed transition finalized
    the node (:attr:`lifecycle_error`), else 0 (a ``shutdown`` transition)."""
    import time

    end = time.monotonic() + linger_s
    while rclpy.ok() and time.monotonic() < end:
        executor.spin_once(timeout_sec=0.05)
    error = getattr(node, "lifecycle_error", None)
    if error:
        node.get_logger().error(f"finalized ({error}): the process ends")
        return 1
    node.get_logger().info("finalized by a shutdown transition: the process ends")
    return 0

"""The ``main()`` of a node's executable: init, build, spin, shut down cleanly."""

from __future__ import annotations

from collections.abc import Callable

import rclpy
from rclpy.executors import ExternalShutdownException

from .parameters import ParameterError


def run_node(make_node: Callable, args: list[str] | None = None, until_done: bool = False) -> int:
    """Init rclpy, build the node, spin it (until ``node.done`` when asked), destroy it;
    Ctrl-C and an external shutdown end it quietly. 1 when a parameter is bad (the node
    has logged which), else 0."""
    try:
        with rclpy.init(args=args):
            try:
                node = make_node()
            except ParameterError:
                return 1  # logged by the node
            try:
                if until_done:
                    rclpy.spin_until_future_complete(node, node.done)
                else:
                    rclpy.spin(node)
            finally:
                node.destroy_node()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    return 0

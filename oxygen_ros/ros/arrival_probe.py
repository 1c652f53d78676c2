"""A subscriber in a process of its own that records when ActionChunk messages arrive.

``oxygen-agent --report`` starts it so that the tick jitter is measured where a
controller sees it: in another process (a ros2_control node, a driver), not in
the agent's own Python process, whose subscriber threads share one interpreter
lock with the inference worker and would add the worker's scheduling to the
figure. It writes the arrival times (``time.monotonic()``, the system-wide
``CLOCK_MONOTONIC``, comparable with the agent's) as JSON when it gets SIGINT or
SIGTERM, or when its parent process goes away.

    python -m oxygen_ros.ros.arrival_probe TOPIC OUT.json
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

READY = "arrival probe ready"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m oxygen_ros.ros.arrival_probe TOPIC OUT.json", file=sys.stderr)
        return 2
    topic, out = args[0], Path(args[1])
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signal.signal(signal.SIGINT, lambda *_: stop.append(True))

    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from rclpy.signals import SignalHandlerOptions

    from oxygen_ros.msg import ActionChunk

    rclpy.init(args=[], signal_handler_options=SignalHandlerOptions.NO)
    node = rclpy.create_node(f"oxygen_arrival_probe_{os.getpid()}")
    arrivals: list[float] = []
    node.create_subscription(ActionChunk, topic, lambda _msg: arrivals.append(time.monotonic()),
                             QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE))
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    parent = os.getppid()
    print(READY, flush=True)
    try:
        while not stop and os.getppid() == parent:
            executor.spin_once(timeout_sec=0.1)
    finally:
        out.write_text(json.dumps({"topic": topic, "arrivals": arrivals}))
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

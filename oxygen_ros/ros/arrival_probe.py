"""A subscriber in a process of its own that records when observations and actions arrive.

``oxygen-agent --report`` starts it so that the tick jitter is measured where a
controller sees it: in another process (a ros2_control node, a driver), not in
the agent's own Python process, whose subscriber threads share one interpreter
lock with the inference worker and would add the worker's scheduling to the
figure; likewise the observation-to-first-action latency (an Observation's
arrival here -> the arrival of the first ActionChunk computed from it). It
writes the arrival times (``time.monotonic()``, the system-wide
``CLOCK_MONOTONIC``, comparable with the agent's) as JSON when it gets SIGINT
or SIGTERM, or when its parent process goes away:
``{"arrivals": [t, ...], "observations": {seq: t}, "first_actions": {frame_id: [seq, t]}}``.

    python -m oxygen_ros.ros.arrival_probe ACTIONS_TOPIC OBSERVATION_TOPIC OUT.json
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
    if len(args) != 3:
        print("usage: python -m oxygen_ros.ros.arrival_probe ACTIONS_TOPIC OBSERVATION_TOPIC OUT.json",
              file=sys.stderr)
        return 2
    topic, observation_topic, out = args[0], args[1], Path(args[2])
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signal.signal(signal.SIGINT, lambda *_: stop.append(True))

    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from rclpy.signals import SignalHandlerOptions

    from oxygen_ros.msg import ActionChunk, Observation

    rclpy.init(args=[], signal_handler_options=SignalHandlerOptions.NO)
    node = rclpy.create_node(f"oxygen_arrival_probe_{os.getpid()}")
    arrivals: list[float] = []
    observations: dict[int, float] = {}
    first_actions: dict[int, list] = {}

    def on_actions(msg) -> None:
        t = time.monotonic()
        arrivals.append(t)
        first_actions.setdefault(int(msg.frame_id), [int(msg.observation_seq), t])

    def on_observation(msg) -> None:
        observations.setdefault(int(msg.seq), time.monotonic())

    reliable = QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE)
    node.create_subscription(ActionChunk, topic, on_actions, reliable)
    node.create_subscription(Observation, observation_topic, on_observation, reliable)
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    parent = os.getppid()
    print(READY, flush=True)
    try:
        while not stop and os.getppid() == parent:
            executor.spin_once(timeout_sec=0.1)
    finally:
        out.write_text(json.dumps({"topic": topic, "arrivals": arrivals, "observations": observations,
                                   "first_actions": first_actions}))
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

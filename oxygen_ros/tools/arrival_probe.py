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
:class:`Probe` is the agent's side: it starts the probe and reads what it wrote.

    python -m oxygen_ros.tools.arrival_probe ACTIONS_TOPIC OBSERVATION_TOPIC OUT.json
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

READY = "arrival probe ready"
START_TIMEOUT_S = 30.0  # its rclpy start-up takes ~1 s


class Probe:
    """This module in a child process, for ``oxygen-agent --report``: started before the
    nodes spin, stopped (SIGINT) at the end of the measurement window; never left running."""

    def __init__(self, actions_topic: str, observation_topic: str, workdir: Path):
        self.out = workdir / f"oxygen_arrivals_{os.getpid()}.json"
        cmd = [sys.executable, "-m", "oxygen_ros.tools.arrival_probe", actions_topic, observation_topic, str(self.out)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        started = select.select([self.proc.stdout], [], [], START_TIMEOUT_S)[0]
        ready = self.proc.stdout.readline().strip() if started else ""
        if ready != READY:
            self.stop()
            raise RuntimeError(f"the arrival probe did not start (exit code {self.proc.returncode})")

    def stop(self) -> dict[str, Any] | None:
        """End the probe; what it recorded (see the module doc), or None."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(5.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        try:
            data = json.loads(self.out.read_text())
            return {"arrivals": data["arrivals"], "observations": {int(k): v for k, v in data["observations"].items()},
                    "first_actions": {int(k): v for k, v in data["first_actions"].items()}}
        except (OSError, ValueError, KeyError):
            return None
        finally:
            self.out.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m oxygen_ros.tools.arrival_probe ACTIONS_TOPIC OBSERVATION_TOPIC OUT.json",
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

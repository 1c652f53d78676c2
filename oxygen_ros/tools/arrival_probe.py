"""A subscriber in a process of its own that records when observations and actions arrive.

``oxygen-agent --report`` starts it so that the tick jitter is measured where a
controller sees it: in another process (a ros2_control node, a driver), not in
the agent's own Python process, whose subscriber threads share one interpreter
lock with the inference worker and would add the worker's scheduling to the
figure; likewise the observation-to-first-action latency (an Observation's
arrival here -> the arrival of the first ActionChunk computed from it). It
writes the arrival times (when the middleware received each message,
:func:`received`, as ``time.monotonic()``, the system-wide ``CLOCK_MONOTONIC``,
comparable with the agent's) as JSON when it gets SIGINT
or SIGTERM, or when its parent process goes away, one stream per pair of
topics (one per robot when the inference node serves several):
``{"streams": [{"actions_topic": ..., "arrivals": [t, ...],
"first_actions": {frame_id: [seq, t, t_obs]}}, ...]}``: ``t_obs`` is the arrival
of the newest Observation with that ``seq`` when the frame's first ActionChunk
came (None: none came), matched then and there, since a camera node that is
restarted (``respawn:=true``) counts its ``seq`` from 0 again. :class:`Probe` is
the agent's side: it starts the probe and reads what it wrote.

Priority: the probe stands for a robot's controller, and a controller's loop runs
under a real-time policy (ros2_control's controller manager asks for ``SCHED_FIFO``
50). ``--priority N`` puts the probe (and the middleware threads it starts, whose
reception times it records) under ``SCHED_FIFO`` N before ROS starts; 0 (the
agent's default, or a refusal, printed) leaves it at normal priority, where on a
busy machine its own wake-up adds to the jitter it measures, but where it does not
take a core from the frames it measures (at N = 40 it did: about 15% of a core,
receiving four robots' actions and observations; reading only an observation's
seq, without deserialising its images, did not lower it). The JSON says which
(``priority``).

    python -m oxygen_ros.tools.arrival_probe [--priority N] ACTIONS_TOPIC OBSERVATION_TOPIC [...] OUT.json
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
    nodes spin, stopped (SIGINT) at the end of the measurement window; never left running.
    ``streams``: ``{key: (actions_topic, observation_topic)}`` (key: a robot, or "")."""

    def __init__(self, streams: dict[str, tuple[str, str]], workdir: Path, priority: int = 0):
        self.out = workdir / f"oxygen_arrivals_{os.getpid()}.json"
        self.keys = list(streams)
        self.priority: int | None = None  # the probe's real-time priority (0: normal), once stopped
        topics = [topic for pair in streams.values() for topic in pair]
        cmd = [sys.executable, "-m", "oxygen_ros.tools.arrival_probe", "--priority", str(priority), *topics,
               str(self.out)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        started = select.select([self.proc.stdout], [], [], START_TIMEOUT_S)[0]
        ready = self.proc.stdout.readline().strip() if started else ""
        if ready != READY:
            self.stop()
            raise RuntimeError(f"the arrival probe did not start (exit code {self.proc.returncode})")

    def stop(self) -> dict[str, dict[str, Any]] | None:
        """End the probe; what it recorded (see the module doc) by stream key, or None."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(5.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        try:
            recorded = json.loads(self.out.read_text())
            streams, self.priority = recorded["streams"], recorded.get("priority")
            return {key: {"arrivals": data["arrivals"],
                          "first_actions": {int(k): v for k, v in data["first_actions"].items()}}
                    for key, data in zip(self.keys, streams, strict=True)}
        except (OSError, ValueError, KeyError, TypeError):
            return None
        finally:
            self.out.unlink(missing_ok=True)


def received(info) -> float:
    """When the middleware received the message (its ``MessageInfo.received_timestamp``, on the
    system clock), as a ``time.monotonic()`` time; the callback's own time where the middleware
    gives none. The probe's one executor serves every stream's callbacks in turn: with several
    robots, the chunks of one tick arrive together, and timing each at its callback would add
    the wait for the others' (in an order that changes from tick to tick) to its jitter."""
    now_mono, now_real = time.monotonic(), time.time_ns()
    stamp = int(info.get("received_timestamp") or 0) if info else 0
    if stamp <= 0 or stamp > now_real:
        return now_mono
    return now_mono - (now_real - stamp) / 1e9


class ArrivalStream:
    """The arrivals on one pair of topics."""

    def __init__(self, node, actions_topic: str, observation_topic: str):
        from rclpy.qos import QoSProfile, ReliabilityPolicy

        from oxygen_ros.msg import ActionChunk, Observation

        self.actions_topic = actions_topic
        self.arrivals: list[float] = []
        self.observations: dict[int, float] = {}
        self.first_actions: dict[int, list] = {}
        reliable = QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE)
        node.create_subscription(ActionChunk, actions_topic, self.on_actions, reliable)
        node.create_subscription(Observation, observation_topic, self.on_observation, reliable)

    def on_actions(self, msg, info) -> None:
        t = received(info)
        self.arrivals.append(t)
        if int(msg.frame_id) not in self.first_actions:
            seq = int(msg.observation_seq)
            self.first_actions[int(msg.frame_id)] = [seq, t, self.observations.get(seq)]

    def on_observation(self, msg, info) -> None:
        self.observations[int(msg.seq)] = received(info)  # the newest: a restarted camera node counts again

    def recorded(self) -> dict[str, Any]:
        return {"actions_topic": self.actions_topic, "arrivals": self.arrivals, "first_actions": self.first_actions}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    priority = 0
    if args[:1] == ["--priority"] and len(args) > 1 and args[1].isdigit():
        priority, args = int(args[1]), args[2:]
    if len(args) < 3 or len(args) % 2 == 0:
        print("usage: python -m oxygen_ros.tools.arrival_probe [--priority N] ACTIONS_TOPIC OBSERVATION_TOPIC "
              "[ACTIONS_TOPIC OBSERVATION_TOPIC ...] OUT.json", file=sys.stderr)
        return 2
    from oxygen_ros.ros.process import realtime_priority

    refused = realtime_priority(priority)  # before rclpy starts its threads: they inherit it
    if refused:
        print(f"arrival probe: --priority {priority} refused, normal priority: {refused}", file=sys.stderr)
        priority = 0
    pairs, out = list(zip(args[:-1:2], args[1:-1:2])), Path(args[-1])
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signal.signal(signal.SIGINT, lambda *_: stop.append(True))

    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.signals import SignalHandlerOptions

    rclpy.init(args=[], signal_handler_options=SignalHandlerOptions.NO)
    node = rclpy.create_node(f"oxygen_arrival_probe_{os.getpid()}")
    streams = [ArrivalStream(node, actions, observations) for actions, observations in pairs]
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    parent = os.getppid()
    print(READY, flush=True)
    try:
        while not stop and os.getppid() == parent:
            executor.spin_once(timeout_sec=0.1)
    finally:
        out.write_text(json.dumps({"priority": priority, "streams": [stream.recorded() for stream in streams]}))
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

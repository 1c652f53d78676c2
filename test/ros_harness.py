"""Helpers for the tests that run real nodes on real DDS (no mocked middleware).

* :func:`ros_environment` - the isolation ``make test`` sets (a domain id, discovery
  on this machine only, a private log directory), set here when missing.
* :class:`Ros` - a private rclpy context; each node spins on its own executor thread.
* :class:`SteppedRos` - a private context whose one executor the test spins itself.
* :func:`until` - wait for a condition, optionally publishing meanwhile.
* :func:`inference_topics` / :func:`inference_node` - the inference node on a topic prefix.
* :func:`observation_msg` - an ``oxygen_ros/Observation`` message from numpy.
* :func:`check_chunks` / :func:`check_text` - the well-formedness rules of the
  inference node's outputs, shared by the node, agent and replay tests.
"""

from __future__ import annotations

import math
import os
import random
import threading
import time
import uuid
from collections import defaultdict

import numpy as np


def ros_environment(monkeypatch, tmp_path) -> int:
    """Set ROS_DOMAIN_ID / ROS_AUTOMATIC_DISCOVERY_RANGE / ROS_LOG_DIR when missing
    (before any rclpy.init); returns the domain id."""
    if not os.environ.get("ROS_DOMAIN_ID"):
        monkeypatch.setenv("ROS_DOMAIN_ID", str(random.Random(os.getpid() ^ time.time_ns()).randint(1, 100)))
    if not os.environ.get("ROS_AUTOMATIC_DISCOVERY_RANGE"):
        monkeypatch.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    if not os.environ.get("ROS_LOG_DIR"):
        monkeypatch.setenv("ROS_LOG_DIR", str(tmp_path / "ros_log"))
    return int(os.environ["ROS_DOMAIN_ID"])


def until(predicate, timeout: float = 30.0, every=None, period: float = 0.05) -> bool:
    """Wait until predicate() is true (False after ``timeout`` s); call every() each
    ``period`` s meanwhile (to keep publishing on best-effort topics)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        if every is not None:
            every()
        time.sleep(period)
    return predicate()


def unique_prefix() -> str:
    """A topic prefix no other test (or concurrent test run) uses."""
    return f"/t_{os.getpid()}_{uuid.uuid4().hex[:8]}"


class Ros:
    """A private context; every node added spins on a SingleThreadedExecutor of its own in a
    background thread, as ``oxygen-agent`` runs them (rclpy's MultiThreadedExecutor keeps a
    core busy rebuilding its wait set, which starves the nodes under test on 2 cores)."""

    def __init__(self):
        import rclpy
        from rclpy.context import Context

        self.context = Context()
        rclpy.init(context=self.context, domain_id=int(os.environ["ROS_DOMAIN_ID"]))
        self.nodes = []
        self._spinners = {}  # node -> (executor, stop event, thread)

    def add(self, node):
        from rclpy.executors import SingleThreadedExecutor

        executor = SingleThreadedExecutor(context=self.context)
        executor.add_node(node)
        stop = threading.Event()
        thread = threading.Thread(target=self._spin, args=(executor, stop), daemon=True,
                                  name=f"ros-test-{node.get_name()}")
        self.nodes.append(node)
        self._spinners[node] = (executor, stop, thread)
        thread.start()
        return node

    @staticmethod
    def _spin(executor, stop) -> None:
        while not stop.is_set():
            try:
                executor.spin_once(timeout_sec=0.02)
            except Exception:  # the context is going down
                if stop.is_set():
                    return
                raise

    def node(self, name: str):
        import rclpy

        return self.add(rclpy.create_node(f"{name}_{uuid.uuid4().hex[:6]}", context=self.context))

    def _stop(self, node) -> None:
        executor, stop, thread = self._spinners.pop(node)
        stop.set()
        thread.join(5.0)
        try:
            executor.remove_node(node)
        except Exception:
            pass
        executor.shutdown()

    def remove(self, node) -> None:
        self._stop(node)
        node.destroy_node()
        self.nodes.remove(node)

    @staticmethod
    def wait_until(predicate, timeout: float, poll: float = 0.02) -> bool:
        return until(predicate, timeout, period=poll)

    def close(self) -> None:
        import rclpy

        for node in reversed(self.nodes):
            self._stop(node)
            node.destroy_node()
        self.nodes.clear()
        rclpy.try_shutdown(context=self.context)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SteppedRos:
    """A private context and one SingleThreadedExecutor that the test itself spins
    (``spin_until``), for tests that interleave publishing and spinning step by step."""

    def __init__(self):
        import rclpy
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor

        self.context = Context()
        rclpy.init(context=self.context, domain_id=int(os.environ["ROS_DOMAIN_ID"]))
        self.executor = SingleThreadedExecutor(context=self.context)
        self.nodes = []
        self.prefix = f"/t{uuid.uuid4().hex[:10]}"

    def add(self, node):
        self.nodes.append(node)
        self.executor.add_node(node)
        return node

    def node(self, name: str = "oxygen_test"):
        import rclpy

        return self.add(rclpy.create_node(f"{name}_{uuid.uuid4().hex[:8]}", context=self.context))

    def spin_until(self, condition, timeout: float = 10.0, every=None, period: float = 0.05) -> bool:
        """Spin until condition() is true (False after ``timeout``); call every() each ``period`` s meanwhile."""
        deadline = time.monotonic() + timeout
        next_call = 0.0
        while not condition():
            now = time.monotonic()
            if now > deadline:
                return False
            if every is not None and now >= next_call:
                every()
                next_call = now + period
            self.executor.spin_once(timeout_sec=0.005)
        return True

    def spin_for(self, seconds: float) -> None:
        self.spin_until(lambda: False, timeout=seconds)

    def close(self) -> None:
        import rclpy

        self.executor.shutdown()
        for node in self.nodes:
            node.destroy_node()
        rclpy.shutdown(context=self.context)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def inference_topics(prefix: str) -> dict[str, str]:
    """The inference node's topic parameters, all under ``prefix``."""
    return {name: f"{prefix}/{name.replace('_topic', '')}" for name in
            ("observation_topic", "question_topic", "actions_topic", "text_topic", "trajectory_topic")}


def inference_node(ros: "Ros", prefix: str, **params):
    """An InferenceNode added to ``ros`` on :func:`inference_topics` (``preset`` tiny,
    the embedded model unless ``model_path`` is given; ``params`` override)."""
    from rclpy.parameter import Parameter

    from oxygen_ros.ros.inference_node import InferenceNode

    values = {**inference_topics(prefix), "preset": "tiny", "model_path": "", **params}
    return ros.add(InferenceNode(context=ros.context, namespace=prefix,
                                 parameter_overrides=[Parameter(k, value=v) for k, v in values.items()]))


def reliable(depth: int):
    from rclpy.qos import QoSProfile, ReliabilityPolicy

    return QoSProfile(depth=depth, reliability=ReliabilityPolicy.RELIABLE)


def observation_msg(seq: int, stamp_ns: int, *, size: int = 32, instruction: str = "pick up the red cube",
                    state=(0.1, -0.2)):
    """An Observation message with one camera ``base`` whose image depends on ``seq``."""
    from oxygen_ros.core.observation import Observation
    from oxygen_ros.ros.conversions import ns_to_time_msg, observation_to_msg

    rng = np.random.default_rng(seq)
    image = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    obs = Observation({"base": image}, instruction, None if state is None else np.asarray(state, np.float32))
    return observation_to_msg(obs, seq, stamp=ns_to_time_msg(stamp_ns))


def check_chunks(chunks, *, horizon: int | None = None, period: float | None = None) -> None:
    """ActionChunk messages as published on one topic, in arrival order, are well formed:
    sizes agree, values finite, header stamps strictly increasing, and within a frame
    the offset advances with every message."""
    assert chunks, "no ActionChunk"
    last_stamp = None
    last_offset: dict[int, int] = {}
    for m in chunks:
        assert m.horizon >= 1 and m.action_dim >= 1
        assert len(m.actions) == m.horizon * m.action_dim, (m.horizon, m.action_dim, len(m.actions))
        assert all(math.isfinite(v) for v in m.actions)
        if horizon is not None:
            assert m.offset + m.horizon == horizon, (m.offset, m.horizon, horizon)
        if period is not None:
            assert math.isclose(m.control_period, period, rel_tol=1e-6)
        stamp = m.header.stamp.sec * 10**9 + m.header.stamp.nanosec
        if last_stamp is not None:
            assert stamp > last_stamp, "header stamps must increase"
        last_stamp = stamp
        if m.frame_id in last_offset:  # +1 per tick; more only if the timer skipped a late tick
            assert m.offset > last_offset[m.frame_id], (m.frame_id, last_offset[m.frame_id], m.offset)
        last_offset[m.frame_id] = m.offset


FINISH_REASONS = ("eos", "length", "rejected", "cancelled")


def check_text(tokens) -> dict[int, list]:
    """TextToken messages in arrival order: per request, indices 0, 1, 2, ... in
    order, one client id, ``done`` only on the last, which has a finish reason.
    Returns {request_id: [messages]} (only requests that finished)."""
    by_request: dict[int, list] = defaultdict(list)
    for m in tokens:
        by_request[m.request_id].append(m)
    for rid, ms in by_request.items():
        if rid == 0:  # refused before it got a request id (no observation yet / shutdown)
            assert all(m.done and m.token_id == -1 and m.finish_reason in ("rejected", "cancelled") for m in ms)
            continue
        assert [m.index for m in ms] == list(range(len(ms))), (rid, [m.index for m in ms])
        assert len({m.client_id for m in ms}) == 1
        assert len({m.frame_id for m in ms}) == 1
        assert not any(m.done for m in ms[:-1]), f"request {rid}: a token after done"
        if ms[-1].done:
            assert ms[-1].finish_reason in FINISH_REASONS, ms[-1].finish_reason
        else:
            assert ms[-1].finish_reason == ""
    return {rid: ms for rid, ms in by_request.items() if ms[-1].done}

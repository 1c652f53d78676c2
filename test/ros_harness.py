"""Helpers for the tests that run real nodes on real DDS (no mocked middleware).

* :func:`ros_environment` - the isolation ``make test`` sets (a domain id, discovery
  on this machine only, a private log directory), set here when missing.
* :func:`checkout_env` / :func:`installed_script` - run this checkout's sources in a subprocess.
* :func:`params` - ``name=value`` keyword arguments as a list of rclpy Parameters.
* :class:`Ros` - a private rclpy context; each node spins on its own executor thread.
* :class:`SteppedRos` - a private context whose one executor the test spins itself.
* :func:`until` - wait for a condition, optionally publishing meanwhile.
* :class:`OutputLines` - a subprocess's output, collected as it comes (to wait for a line).
* :func:`stall_in_prefill` - hold an engine's next frame, as a hung device would.
* :func:`play_once_matched` - start a lockstep bag player once the policy's actions can reach it;
  :func:`player_progress` - where it stands, when it did not finish.
* :func:`inference_topics` / :func:`inference_node` - the inference node on a topic prefix.
* :class:`InferenceClient` - a test node publishing Observations and Questions to an
  inference node and recording everything it publishes.
* (messages to send, well formed or not, are built by message_builders.py)
* :func:`installed_prefix` / :func:`executables` - where ``make venv`` installed the package, and what.
* :func:`check_chunks` / :func:`check_text` - the well-formedness rules of the
  inference node's outputs, shared by the node, agent and replay tests.
"""

from __future__ import annotations

import math
import os
import random
import signal
import re
import sys
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path

from message_builders import observation_msg

REPO = Path(__file__).resolve().parents[1]


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


def checkout_env() -> dict[str, str]:
    """The environment for a subprocess that must run this checkout's sources
    (PYTHONPATH puts the checkout first; output unbuffered)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def from_a_terminal(*ignored: int):
    """A ``preexec_fn``: the child starts with SIGINT and SIGHUP at their defaults, as a command
    typed in a terminal does, but for the ``ignored`` signals. A suite started as a background job
    (``make test &``) has SIGINT ignored, under ``nohup`` SIGHUP, and a child inherits both: a
    command that rightly keeps an ignored signal ignored would then not be testing Ctrl-C."""

    def preexec() -> None:
        for signum in (signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN if signum in ignored else signal.SIG_DFL)

    return preexec


def installed_script(name: str) -> str:
    """The path of an installed console script (``oxygen-agent``, ...); the test fails if it is missing."""
    import pytest

    path = Path(sys.prefix) / "bin" / name
    if not path.is_file():
        pytest.fail(f"{path} missing (run `make venv`)")
    return str(path)


def params(**values) -> list:
    """``name=value`` pairs as rclpy Parameters (for ``parameter_overrides`` or ``set_parameters``)."""
    from rclpy.parameter import Parameter

    return [Parameter(k, value=v) for k, v in values.items()]


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


class OutputLines:
    """The lines a subprocess writes to its piped stdout, collected on a thread as they come,
    so that a test waits for a line (:meth:`has`) instead of sleeping what it should take."""

    def __init__(self, proc):
        self.proc, self.lines = proc, []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    def text(self, last: int | None = None) -> str:
        out = "".join(self.lines)
        return out if last is None else out[-last:]

    def has(self, pattern: str) -> bool:
        """Whether a line so far matches the regular expression ``pattern``."""
        return re.search(pattern, self.text()) is not None

    def join(self, timeout: float = 5.0) -> str:
        """The whole output, once the process has closed it (it has ended)."""
        self._reader.join(timeout)
        return self.text()


def play_once_matched(ros, player, inference, robots=(None,), subscribers: int = 2, timeout: float = 30.0) -> None:
    """Start a lockstep ``player`` (made with a long ``start_delay_s``) once every topic it plays
    has a subscription and each robot's ActionChunk publisher (the inference node's, in its
    control process) has matched ``subscribers`` subscriptions: the player's lockstep one and
    the test's. A reliable writer sends nothing to a reader it has not matched yet, and the
    player sees only its own side of the match."""
    def matched() -> bool:
        return not player.unmatched_topics() and all(inference.action_subscribers(r) >= subscribers for r in robots)

    assert ros.wait_until(matched, timeout), (player.unmatched_topics(),
                                              {r: inference.action_subscribers(r) for r in robots})
    player.start_now()


def player_progress(ros, player) -> str:
    """Where a bag player stands, for the message of a test whose player did not finish."""
    now = time.monotonic()
    gates = {key or "action_topic": dict(answered_seq=gate.action_seq, timeouts=gate.timeouts,
                                         held_s=None if gate.hold_since is None else round(now - gate.hold_since, 2))
             for key, gate in player.lockstep_gates.items()}
    return (f"the bag player did not finish: {player.published} message(s) published in {player.passes} pass(es), "
            f"finished={player.finished}, lockstep gates {gates}, its executor last came back from spin_once "
            f"{ros.spin_age(player):.2f} s ago")


def stall_in_prefill(engine, timeout: float = 60.0):
    """Hold ``engine``'s next frame in its prefill (its ``pause_point`` hook), as a hung device
    would: returns (entered, release) events; the frame goes on once ``release`` is set (or
    after ``timeout``). Set ``engine.pause_point = None`` before releasing, or the next frame
    stalls too."""
    entered, release = threading.Event(), threading.Event()

    def stall(work: str) -> None:  # the engine's hook before each piece of a frame
        if work == "prefill":
            entered.set()
            release.wait(timeout)

    engine.pause_point = stall
    return entered, release


def process_ended(pid: int) -> bool:
    """Whether the process ``pid`` has ended: gone, or a zombie its parent has not yet polled."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


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
        self._died = {}  # node name -> the exception its executor thread ended with
        self._spun_at = {}  # node name -> when its executor last returned from spin_once

    def add(self, node):
        from rclpy.executors import SingleThreadedExecutor

        executor = SingleThreadedExecutor(context=self.context)
        executor.add_node(node)
        stop = threading.Event()
        thread = threading.Thread(target=self._spin, args=(node.get_name(), executor, stop), daemon=True,
                                  name=f"ros-test-{node.get_name()}")
        self.nodes.append(node)
        self._spinners[node] = (executor, stop, thread)
        thread.start()
        return node

    def _spin(self, name: str, executor, stop) -> None:
        while not stop.is_set():
            try:
                executor.spin_once(timeout_sec=0.02)
            except Exception as exc:  # the context is going down, or a callback raised
                if stop.is_set():
                    return
                self._died[name] = exc
                raise
            self._spun_at[name] = time.monotonic()

    def spin_age(self, node) -> float:
        """Seconds since ``node``'s executor last came back from spin_once (a callback that
        blocks, or a thread that died, makes it grow)."""
        return time.monotonic() - self._spun_at.get(node.get_name(), -math.inf)

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

    def wait_until(self, predicate, timeout: float, poll: float = 0.02) -> bool:
        """Wait for ``predicate``; fails at once, naming the node and its error, when a node's
        executor thread died meanwhile (a callback raised): nothing of that node runs any more."""
        def holds() -> bool:
            if self._died:
                raise AssertionError(f"an executor thread died: {self._died!r}")
            return predicate()

        return until(holds, timeout, period=poll)

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


def inference_node(ros: "Ros", prefix: str, **overrides):
    """An InferenceNode added to ``ros`` on :func:`inference_topics` (``preset`` tiny,
    the embedded model unless ``model_path`` is given; ``overrides`` override)."""
    from oxygen_ros.ros.inference_node import InferenceNode

    values = {**inference_topics(prefix), "preset": "tiny", "model_path": "", **overrides}
    return ros.add(InferenceNode(context=ros.context, namespace=prefix, parameter_overrides=params(**values)))


def camera_node(ros: "SteppedRos", **overrides):
    """A CameraNode added to ``ros`` (32-pixel images, 5 s max age), reading a raw camera
    ``{ros.prefix}/cam_raw`` and a compressed one ``{ros.prefix}/cam_jpeg``, the instruction
    on ``{ros.prefix}/instruction``, publishing on ``{ros.prefix}/observation``; ``overrides`` override."""
    from oxygen_ros.ros.camera_node import CameraNode

    p = ros.prefix
    values = {
        "image_topics": [f"{p}/cam_raw"],
        "compressed_image_topics": [f"{p}/cam_jpeg"],
        "instruction_topic": f"{p}/instruction",
        "observation_topic": f"{p}/observation",
        "image_size": 32,
        "max_age": 5.0,
        **overrides,
    }
    return ros.add(CameraNode(context=ros.context, parameter_overrides=params(**values)))


def reliable(depth: int):
    from rclpy.qos import QoSProfile, ReliabilityPolicy

    return QoSProfile(depth=depth, reliability=ReliabilityPolicy.RELIABLE)


class InferenceClient:
    """A test node on an inference node's topics (:func:`inference_topics`): publishes
    observations and questions, records every ActionChunk, TextToken and JointTrajectory,
    and the statuses on /diagnostics of the ``oxygen_inference`` node in namespace ``prefix``
    (as :func:`inference_node` makes it). Waits until it and the inference node have discovered each other."""

    def __init__(self, ros, prefix: str, name: str = "oxygen_test_client", node=None):
        from diagnostic_msgs.msg import DiagnosticArray
        from oxygen_ros.msg import ActionChunk, Observation, Question, TextToken
        from trajectory_msgs.msg import JointTrajectory

        t = inference_topics(prefix)
        self._status_prefix = f"{prefix.lstrip('/')}/oxygen_inference: "  # the node's, in namespace prefix
        self.node = ros.node(name)
        self.chunks, self.text, self.trajectories, self.diagnostics = [], [], [], []
        actions = self.node.create_subscription(ActionChunk, t["actions_topic"], self.chunks.append, reliable(200))
        self.node.create_subscription(TextToken, t["text_topic"], self.text.append, reliable(5000))
        self.node.create_subscription(JointTrajectory, t["trajectory_topic"], self.trajectories.append, reliable(100))
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, reliable(50))
        self.obs = self.node.create_publisher(Observation, t["observation_topic"], reliable(10))
        self.q = self.node.create_publisher(Question, t["question_topic"], reliable(100))
        self.Question = Question
        self.seq = 0
        # the node's inputs, and its ActionChunk publisher (in the control process by default, a
        # participant of its own that this one discovers separately); with ``node``, also that
        # publisher's side: once it has matched this subscription, no ActionChunk is lost to discovery
        assert until(lambda: self.obs.get_subscription_count() >= 1 and self.q.get_subscription_count() >= 1
                     and actions.get_publisher_count() >= 1
                     and (node is None or node.action_subscribers() >= 1)), "inference node not discovered"

    def _on_diagnostics(self, msg) -> None:
        self.diagnostics.extend(s for s in msg.status if s.name.startswith(self._status_prefix))

    def now(self) -> int:
        return self.node.get_clock().now().nanoseconds

    def observe(self, age_s: float = 0.0, **kw) -> None:
        """Publish the next observation (:func:`observation_msg`), stamped ``age_s`` in the past."""
        self.obs.publish(observation_msg(self.seq, self.now() - round(age_s * 1e9), **kw))
        self.seq += 1

    def publish_observations(self, seconds: float, rate_hz: float = 20.0) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.observe()
            time.sleep(1.0 / rate_hz)

    def ask(self, client_id: str, text: str = "what do you see?") -> None:
        self.q.publish(self.Question(client_id=client_id, text=text))

    def finished(self, client_id: str) -> list:
        return [m for m in self.text if m.client_id == client_id and m.done]


class Lifecycle:
    """A client of a node's lifecycle services."""

    def __init__(self, node, full_name: str):
        from lifecycle_msgs.srv import ChangeState, GetState

        self.node, self.name = node, full_name
        self._get = node.create_client(GetState, f"{full_name}/get_state")
        self._change = node.create_client(ChangeState, f"{full_name}/change_state")
        assert self._get.wait_for_service(timeout_sec=20.0) and self._change.wait_for_service(timeout_sec=20.0)

    def _call(self, client, request):
        future = client.call_async(request)
        assert until(future.done, 60.0), f"{self.name}: no answer"
        return future.result()

    def state(self) -> str:
        from lifecycle_msgs.srv import GetState

        return self._call(self._get, GetState.Request()).current_state.label

    def change(self, transition: str) -> bool:
        from lifecycle_msgs.msg import Transition
        from lifecycle_msgs.srv import ChangeState

        request = ChangeState.Request(transition=Transition(id=getattr(Transition, f"TRANSITION_{transition.upper()}")))
        return self._call(self._change, request).success


class AskClient:
    """An ``Ask`` action client (a node of its own in ``ros``) on ``action``."""

    def __init__(self, ros: Ros, action: str):
        from oxygen_ros.action import Ask
        from rclpy.action import ActionClient

        import rclpy

        self.Ask = Ask
        # the client is made before its node spins: Kilted's ActionClient adds itself to the node
        # before it has its lock, and an executor thread that looks at it then dies (AttributeError)
        self.node = rclpy.create_node(f"oxygen_test_ask_client_{uuid.uuid4().hex[:6]}", context=ros.context)
        self.client = ActionClient(self.node, Ask, action)
        ros.add(self.node)
        assert self.client.wait_for_server(timeout_sec=20.0), "no Ask server"

    def send(self, question: str, max_tokens: int = 0):
        """(goal handle, feedback list) once the goal was answered."""
        feedback = []
        future = self.client.send_goal_async(self.Ask.Goal(question=question, max_tokens=max_tokens),
                                             feedback_callback=lambda m: feedback.append(m.feedback))
        assert until(future.done, 20.0), "goal not answered"
        return future.result(), feedback

    @staticmethod
    def result(handle):
        future = handle.get_result_async()
        assert until(future.done, 60.0), "no result"
        return future.result()


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
            assert all(m.observation_seq == 0 and m.observation_stamp.sec == m.observation_stamp.nanosec == 0
                       for m in ms)  # no observation to name
            continue
        assert [m.index for m in ms] == list(range(len(ms))), (rid, [m.index for m in ms])
        assert len({m.client_id for m in ms}) == 1
        assert len({m.frame_id for m in ms}) == 1
        # every token names the one observation its request reads
        assert len({(m.observation_seq, m.observation_stamp.sec, m.observation_stamp.nanosec) for m in ms}) == 1
        assert not any(m.done for m in ms[:-1]), f"request {rid}: a token after done"
        if ms[-1].done:
            assert ms[-1].finish_reason in FINISH_REASONS, ms[-1].finish_reason
        else:
            assert ms[-1].finish_reason == ""
    return {rid: ms for rid, ms in by_request.items() if ms[-1].done}


def installed_prefix() -> Path:
    """The prefix that holds the installed oxygen_ros (e.g. .venv)."""
    import pytest

    import oxygen_ros.msg

    for parent in Path(oxygen_ros.msg.__file__).resolve().parents:
        if (parent / "share" / "ament_index" / "resource_index" / "packages" / "oxygen_ros").is_file():
            return parent
    pytest.fail(f"oxygen_ros is not installed: no ament index above {oxygen_ros.msg.__file__} (run `make venv`)")


def executables() -> list[tuple[str, str, str, str]]:
    """(name, where, module, function) from resource/executables.txt."""
    rows = []
    for line in (REPO / "resource" / "executables.txt").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, where, target = line.split()
        module, function = target.split(":")
        rows.append((name, where, module, function))
    return rows

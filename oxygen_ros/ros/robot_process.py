"""A robot's camera side in a child process of its own (``oxygen-agent --robot-processes``).

On real robots the camera node runs on the robot's machine and only
Observations and ActionChunks reach the inference node. Here, per robot, the
agent starts ``python -m oxygen_ros.ros.robot_process PLAN.json``: that
robot's plan items (its camera node and, with ``demo:=true``, its synthetic
camera; see :mod:`.robot_plan`), built by the same
:func:`.plan.build_nodes` with the same parameters file, parameter
overrides and remappings as in the agent's process (the items go over as
JSON), spun by a :class:`.spinner.Spinner` (the synthetic camera's thread at
the lower priority). The inference node and the agent's own nodes stay in
the agent's process, so the robots' image conversions and callbacks no
longer share its interpreter lock.

A child prints :data:`READY` once its nodes spin, and ends (exit code 0) on
SIGINT or SIGTERM or as soon as the agent's process is gone (it checks its
parent every 0.1 s, so even a killed agent leaves no child); 1 when one of
its nodes stopped, 2 for a bad parameter. :class:`RobotProcesses` is the
agent's side: it starts them in a session of their own (a Ctrl-C in the
terminal reaches the agent, which stops them after its own shutdown), tells
which robot's child ended, and stops every child at the end.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from .plan import (
    build_nodes, check_params_file, exit_how, node_label, not_restarted, own_log, respawn_message, restarts,
)
from .plan_tables import NODES

READY = "robot process ready"
START_TIMEOUT_S = 120.0  # rclpy and the nodes' modules, on a busy 2-core machine
STOP_TIMEOUT_S = 5.0
INFERENCE = "oxygen_inference"  # the node that stays in the agent's process


class RobotProcessError(RuntimeError):
    """A robot's child process did not start (the message names the robot); ``code``: its exit
    status (2: a bad parameter), None when it did not end."""

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code


def camera_sides(plan: list[dict[str, Any]]) -> dict[str | None, list[dict[str, Any]]]:
    """The plan's items other than the inference node, by robot (None: the one robot of a
    plan without ``robots``), in plan order."""
    sides: dict[str | None, list[dict[str, Any]]] = {}
    for item in plan:
        if item["spec"].name != INFERENCE:
            sides.setdefault(item.get("robot"), []).append(item)
    return sides


def encode_items(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Plan items as JSON-ready dicts (the node spec by its name)."""
    return [{**item, "spec": item["spec"].name, "remappings": [list(r) for r in item["remappings"]]}
            for item in items]


def decode_items(data: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The plan items :func:`encode_items` wrote."""
    specs = {spec.name: spec for spec in NODES}
    return [{**item, "spec": specs[item["spec"]], "remappings": [tuple(r) for r in item["remappings"]]}
            for item in data]


def respawn_delay(items: list[dict[str, Any]]) -> float | None:
    """The seconds before a camera side of these plan items is restarted (None: ``respawn`` is off)."""
    return next((d for item in items if (d := item.get("respawn_delay")) is not None), None)


def respawn_max_retries(items: list[dict[str, Any]]) -> int | None:
    """The most restarts of a camera side of these plan items (None: no limit, or ``respawn`` off)."""
    return next((n for item in items if (n := item.get("respawn_max_retries")) is not None), None)


def side_label(robot: str | None) -> str:
    return f"robot {robot}'s camera side" if robot else "the camera side"


class RobotProcess:
    """One robot's camera side in a child process (see the module doc)."""

    def __init__(self, robot: str | None, items: list[dict[str, Any]], params_file: str, background_niceness: int):
        self.robot, self.label, self.items = robot, side_label(robot), items
        self.restart_at: float | None = None  # when it ended and is to be restarted (``time.monotonic()``)
        self.nodes = ", ".join(node_label(item) for item in items)
        fd, name = tempfile.mkstemp(prefix=f"oxygen_robot_{robot or 'camera'}_", suffix=".json")
        self.plan_file = Path(name)
        with os.fdopen(fd, "w") as f:
            json.dump({"robot": robot, "items": encode_items(items), "params_file": params_file,
                       "background_niceness": background_niceness, "parent": os.getpid()}, f)
        cmd = [sys.executable, "-m", "oxygen_ros.ros.robot_process", str(self.plan_file)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.ready = self.interrupted = False

    def wait_ready(self, deadline: float) -> None:
        """Wait for the child's :data:`READY`; RobotProcessError naming the robot if it ended or
        did not get there by ``deadline`` (``time.monotonic()``)."""
        started = select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]
        line = self.proc.stdout.readline().strip() if started else ""
        if line != READY:
            if self.proc.poll() is None and not started:
                raise RobotProcessError(f"{self.label} ({self.nodes}) did not start within {START_TIMEOUT_S:.0f} s")
            self.proc.wait(STOP_TIMEOUT_S)
            raise RobotProcessError(self.exit_message(), self.proc.returncode)
        self.ready = True

    def poll_ready(self) -> bool:
        """Whether the child said :data:`READY` (by now: this never waits)."""
        if not self.ready and select.select([self.proc.stdout], [], [], 0)[0]:
            self.ready = self.proc.stdout.readline().strip() == READY
        return self.ready

    @property
    def name(self) -> str:
        """The child as logs name it: ``robot b's camera side (b/oxygen_camera; pid N)``."""
        return f"{self.label} ({self.nodes}; pid {self.proc.pid})"

    def exit_message(self) -> str:
        return f"{self.name} {exit_how(self.proc.returncode)}{own_log(self.proc.returncode)}"

    def failure(self) -> str | None:
        """Why this child no longer runs (None while it does)."""
        return None if self.proc.poll() is None else self.exit_message()

    def interrupt(self) -> None:
        """Ask the child to end (SIGINT), once."""
        if self.proc.poll() is None and not self.interrupted:
            self.proc.send_signal(signal.SIGINT)
            self.interrupted = True

    def stop(self) -> None:
        """SIGINT, then after :data:`STOP_TIMEOUT_S` SIGKILL; the plan file goes too."""
        try:
            self.interrupt()
            if self.proc.poll() is None:
                try:
                    self.proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.proc.stdout.close()
        finally:
            self.plan_file.unlink(missing_ok=True)


class RobotProcesses:
    """Every camera side of ``sides`` (see :func:`camera_sides`; none: nothing to do) in a
    child process of its own, from :meth:`start` on. With the plan's ``respawn_delay``
    (``respawn:=true``), :meth:`supervise` restarts a child that ends once the nodes spin."""

    def __init__(self, sides: dict[str | None, list[dict[str, Any]]], params_file: str, background_niceness: int):
        self.sides, self.params_file, self.background_niceness = sides, params_file, background_niceness
        self.children: list[RobotProcess] = []
        items = [item for items in sides.values() for item in items]
        self.respawn_delay, self.max_retries = respawn_delay(items), respawn_max_retries(items)
        self.restarts: dict[str | None, int] = dict.fromkeys(sides, 0)
        self._ended: str | None = None  # why the run ends: a child that is not restarted
        self._stop = threading.Event()
        self._supervisor: threading.Thread | None = None

    def start(self) -> None:
        for robot, items in self.sides.items():
            self.children.append(RobotProcess(robot, items, self.params_file, self.background_niceness))

    def supervise(self, log) -> None:
        """From now on (every node spins), restart a child that ends after ``respawn_delay``
        (logged with ``log``), unless it ended for a bad parameter (2: then :meth:`failure`
        says so); without ``respawn_delay`` nothing: a child that ends is a failure."""
        if self.respawn_delay is None or not self.children:
            return
        self._supervisor = threading.Thread(target=self._supervise, args=(log,), daemon=True,
                                            name="oxygen-agent-respawn")
        self._supervisor.start()

    def _supervise(self, log) -> None:
        while self._ended is None and not self._stop.wait(0.1):
            for i, child in enumerate(self.children):
                code = child.proc.poll()
                if code is None:
                    if not child.ready and child.poll_ready():
                        log(f"{child.name} runs again (restart {self.restarts[child.robot]})")
                elif not restarts(code, self.respawn_delay, self.restarts[child.robot], self.max_retries):
                    self._ended = f"{child.name} {exit_how(code)}{not_restarted(code, self.max_retries)}{own_log(code)}"
                    return
                elif child.restart_at is None:
                    child.restart_at = time.monotonic() + self.respawn_delay
                    log(respawn_message(child.name, code, self.respawn_delay, self.restarts[child.robot] + 1,
                                        self.max_retries))
                elif time.monotonic() >= child.restart_at:
                    try:  # one that cannot be read ends the run, as it would a start
                        check_params_file(self.params_file)
                    except ValueError as exc:
                        self._ended = f"{child.name} {exit_how(code)}; not restarted: {exc}"
                        return
                    child.stop()
                    self.children[i] = RobotProcess(child.robot, child.items, self.params_file,
                                                    self.background_niceness)
                    self.restarts[child.robot] += 1

    def wait_ready(self) -> None:
        """Wait until every child's nodes spin; RobotProcessError naming the first that did not."""
        deadline = time.monotonic() + START_TIMEOUT_S
        for child in self.children:
            child.wait_ready(deadline)

    def failure(self) -> str | None:
        """Why a child no longer runs (the first one's), None while all do; once
        :meth:`supervise` restarts them, why one is not restarted."""
        if self._supervisor is not None:
            return self._ended
        return next((f for child in self.children if (f := child.failure()) is not None), None)

    def stop(self) -> None:
        """Stop restarting, then every child (all are signalled before any is waited for)."""
        self._stop.set()
        if self._supervisor is not None:
            self._supervisor.join()
        for child in self.children:
            child.interrupt()
        for child in self.children:
            child.stop()


def _spin_until_told(spinner, parent: int) -> int:
    """Until SIGINT/SIGTERM (a KeyboardInterrupt), the parent's end (0) or a node's (1)."""
    while spinner.alive() and os.getppid() == parent:
        time.sleep(0.1)
    return 0 if spinner.alive() else 1


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m oxygen_ros.ros.robot_process PLAN.json", file=sys.stderr)
        return 2
    plan = Path(args[0])
    config = json.loads(plan.read_text())
    plan.unlink(missing_ok=True)  # read once: nothing is left in the temp dir even if the agent is killed
    label = side_label(config["robot"])
    from rclpy._rclpy_pybind11 import RCLError
    from rclpy.executors import ExternalShutdownException

    from ..core.interrupts import honour_interrupts
    from .parameters import ParameterError
    from .process import init_control_process, settle_garbage_collector
    from .spinner import Spinner

    init_control_process([], sigint_once=True)
    nodes: list = []
    spinner = None
    try:
        with honour_interrupts():  # a Ctrl-C while they start, even one a library swallowed
            build_nodes(decode_items(config["items"]), config["params_file"], nodes)
        settle_garbage_collector()
        spinner = Spinner("split", nodes, background_niceness=config["background_niceness"])
        print(READY, flush=True)
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # nobody reads the pipe from now on
        code = _spin_until_told(spinner, config["parent"])
        if code:
            print(f"{label}: {spinner.failure or 'an executor stopped'}", file=sys.stderr, flush=True)
        return code
    except ParameterError as exc:
        print(f"{label}: {exc.node + ': ' if exc.node else ''}{exc}", file=sys.stderr, flush=True)
        return 2
    except RCLError as exc:  # rcl refused the parameters file (changed since the start, and not YAML now)
        print(f"{label}: cannot start: {exc}", file=sys.stderr, flush=True)
        return 2
    except (KeyboardInterrupt, ExternalShutdownException):
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # ending already: a second signal would break it
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _close(spinner, nodes)


def _close(spinner, nodes: list) -> None:
    import rclpy

    if spinner is not None:
        spinner.shutdown()
    for node in reversed(nodes):
        node.destroy_node()
    rclpy.try_shutdown()


if __name__ == "__main__":
    sys.exit(main())

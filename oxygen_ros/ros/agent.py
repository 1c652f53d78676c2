"""The one start-up that runs a plan's nodes in this process, for ``oxygen-agent`` and ``oxygen-soak``.

The plan itself (nodes, launch arguments, the parameters file) is :mod:`.plan`,
shared with the launch file. The start-up (:func:`run_agent`): the process
set-up of :mod:`.process`, the nodes built from the parameters file (each
robot's camera side in a process of its own with ``robot_processes``,
:mod:`.robot_process`), the command's own nodes (a :class:`Session`), every
node spun in background threads (:class:`.spinner.Spinner`), and the teardown,
whatever ends the run. The commands themselves (status line, report, soak) live
in ``oxygen_ros.tools``.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Protocol

from ..core.interrupts import honour_interrupts
from .plan import build_nodes, node_label, resolve, plan_warnings
from .robot_process import (
    INFERENCE, RobotProcessError, RobotProcesses, camera_sides, respawn_delay, respawn_max_retries,
)
from .spinner import BACKGROUND_NICENESS, CONTROL_PATH, EXECUTORS, Spinner  # noqa: F401 (the agent's layout)


class Agent:
    """The nodes of a plan in this process: built with the parameters file, then the
    command's own nodes (:meth:`add`), spun in background threads, destroyed at the end;
    ``robot_processes``: every robot's camera side in a process of its own (:mod:`.robot_process`)."""

    def __init__(self, plan: list[dict[str, Any]], params_file: str, robot_processes: bool = False,
                 background_niceness: int = BACKGROUND_NICENESS):
        self.plan, self.params_file = plan, params_file
        sides = camera_sides(plan) if robot_processes else {}
        self.local = [item for item in plan if not robot_processes or item["spec"].name == INFERENCE]
        self.nodes: list = []  # in the order made: the plan's (here), then the command's own
        self.spinner: Spinner | None = None
        self.children = RobotProcesses(sides, params_file, background_niceness)  # started by build()

    def build(self, log=print) -> None:
        """Start the robots' processes, construct this process's nodes (kept for :meth:`close` on a
        failure). A robot's process that ends while they are built (minutes, compiling) is said
        at once with ``log``; the start fails after the build, naming it."""
        self.children.start()
        built = threading.Event()
        watch = threading.Thread(target=self._watch_children, args=(built, log), daemon=True,
                                 name="oxygen-agent-robots-watch")
        watch.start()
        try:
            build_nodes(self.local, self.params_file, self.nodes)
        finally:
            built.set()
        self.children.wait_ready()

    def _watch_children(self, built: threading.Event, log) -> None:
        while not built.wait(0.2):
            if (failure := self.children.failure()) is not None:
                log(f"{failure}; the agent ends once its inference node is built")
                return

    def node(self, name: str, robot: str | None = None):
        """The node called ``name`` (in ``robot``'s namespace, or the root one); KeyError
        listing the nodes when there is none."""
        namespace = f"/{robot}" if robot else "/"
        for node in self.nodes:
            if node.get_name() == name and node.get_namespace() == namespace:
                return node
        raise KeyError(f"no node {name!r} in namespace {namespace} of this agent "
                       f"(nodes: {[n.get_fully_qualified_name() for n in self.nodes]})")

    @property
    def robots(self) -> tuple[str, ...]:
        """The robots of the plan (empty: one robot on the configured topics)."""
        return tuple(dict.fromkeys(item["robot"] for item in self.plan if item.get("robot")))

    @property
    def inference(self):
        return self.node(INFERENCE)

    def add(self, node):
        """Add a node of the command's own (spun and destroyed with the others); returns it."""
        self.nodes.append(node)
        return node

    def spin(self, executor: str = "split", background_niceness: int = BACKGROUND_NICENESS) -> None:
        """Freeze the start-up garbage, then spin every node: the inference node first,
        then the command's own, then the rest of the plan's."""
        from .process import settle_garbage_collector

        settle_garbage_collector()
        built, own = self.nodes[:len(self.local)], self.nodes[len(self.local):]
        inference = self.inference
        order = [inference, *own, *(n for n in built if n is not inference)]
        self.spinner = Spinner(executor, order, background_niceness=background_niceness)

    def alive(self) -> bool:
        """Every node still runs: each executor spins, the inference node's frame worker lives,
        and no lifecycle shutdown finalized the inference node."""
        return self.spinner is not None and self.failure() is None and self.shut_down() is None

    def shut_down(self) -> str | None:
        """What ended the run without a failure: the inference node was finalized by a lifecycle
        ``shutdown`` (None while it was not)."""
        inference = self.inference
        if not getattr(inference, "finalized", False) or inference.lifecycle_error is not None:
            return None
        return f"{inference.get_fully_qualified_name()} was shut down (lifecycle shutdown): ending"

    def failure(self) -> str | None:
        """Why a node of this agent, or a robot's child process, no longer runs (None while all do)."""
        if self.spinner is not None and not self.spinner.alive():
            return self.spinner.failure or "an executor stopped"
        if self.spinner is not None and (failure := self.children.failure()) is not None:
            return failure
        if getattr(self.inference, "finalized", False):  # its worker and control process were stopped
            error = self.inference.lifecycle_error
            return None if error is None else f"{INFERENCE}: {error}"
        worker = getattr(self.inference, "worker", None)
        if self.spinner is not None and worker is not None and worker.died:
            return f"{INFERENCE}: its frame worker stopped ({worker.death})"
        control = getattr(self.inference, "control_failure", None)
        if self.spinner is not None and control is not None:
            return f"{INFERENCE}: {control}"
        return None

    def close(self) -> None:
        """Stop the robots' processes and spinning, destroy every node (last made first), shut rclpy down."""
        import rclpy

        self.children.stop()
        if self.spinner is not None:
            self.spinner.shutdown()
        for node in reversed(self.nodes):
            node.destroy_node()
        rclpy.try_shutdown()


class Session(Protocol):
    """What a command adds to the agent's start-up (see :func:`run_agent`)."""

    def start(self, agent: Agent) -> None:
        """The plan's nodes exist: make the command's own (``agent.add``) before spinning."""

    def run(self, agent: Agent) -> int:
        """The nodes spin: the command's main loop; returns the exit status."""

    def finish(self, agent: Agent) -> None:
        """After the main loop, whatever ended it (even Ctrl-C), while the nodes still spin."""


def sides_apart(plan: list[dict[str, Any]], robot_processes: bool | None) -> bool:
    """Whether the camera sides of ``plan`` run in processes of their own: ``robot_processes``,
    and when None, with robots or with ``respawn:=true`` (which restarts such a process);
    ValueError for ``respawn:=true`` with ``robot_processes`` False."""
    respawn = respawn_delay(plan) is not None
    if robot_processes is None:
        return respawn or any(item.get("robot") for item in plan)
    if respawn and not robot_processes:
        raise ValueError("respawn:=true restarts a camera side in its own process: it cannot with "
                         "--no-robot-processes")
    return robot_processes


def _announce(prog: str, plan: list[dict[str, Any]], params_file: str, robot_processes: bool) -> None:
    """Print what starts, and the plan's warnings."""
    respawn, most = respawn_delay(plan), respawn_max_retries(plan)
    limit = "" if most is None else ", at most once" if most == 1 else f", at most {most} times"
    print(f"{prog}: parameters from {params_file}; nodes: " + ", ".join(node_label(item) for item in plan)
          + ("; every robot's camera side in a process of its own" if robot_processes else "")
          + (f", restarted {respawn:g} s after it ends{limit} (respawn:=true)" if respawn is not None else ""),
          flush=True)
    for line in plan_warnings(plan, params_file):
        print(f"{prog}: warning: {line}", file=sys.stderr, flush=True)


def run_agent(prog: str, values: dict[str, str], session: Session, executor: str = "split",
              background_niceness: int = BACKGROUND_NICENESS, robot_processes: bool | None = None) -> int:
    """Run the plan's nodes for the launch-argument ``values`` in this process (with ``robot_processes``
    the robots' camera sides in their own; None: when the plan has robots, from ``robots:=`` or the
    params file, as measured best in docs/several_robots.md, or ``respawn:=true``) with ``session``; the exit status: 2
    for a bad argument or parameter (printed after ``prog:``), 1 when a node or a robot's process stopped, else
    ``session.run``'s (0 when interrupted by Ctrl-C or SIGTERM)."""
    try:
        with honour_interrupts():  # torch and transformers load for its checks: seconds
            plan, params_file = resolve(values)
            robot_processes = sides_apart(plan, robot_processes)
            _announce(prog, plan, params_file, robot_processes)
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    from rclpy.executors import ExternalShutdownException

    from .parameters import ParameterError
    from .process import init_control_process

    # the SIGINT that interrupts turns SIGINT off: a second one, sent with it (a `timeout` or launch
    # forwarding the signal its process group got too), cut the clean-up and lost the report
    init_control_process([], sigint_once=True)
    agent, code = Agent(plan, params_file, robot_processes, background_niceness), 0
    log = lambda line: print(f"{prog}: {line}", file=sys.stderr, flush=True)  # noqa: E731
    try:
        with honour_interrupts():  # a Ctrl-C while the nodes start, even one a library swallowed
            agent.build(log)
        session.start(agent)
        agent.spin(executor, background_niceness)
        agent.children.supervise(log)  # respawn:=true: from now on a camera side that ends is restarted
        code = session.run(agent)
        if (failure := agent.failure()) is not None:  # a node died: the run failed, whatever the session says
            print(f"{prog}: {failure}", file=sys.stderr, flush=True)
            code = code or 1
        elif (ended := agent.shut_down()) is not None:
            print(f"{prog}: {ended}", flush=True)
    except (ParameterError, RobotProcessError) as exc:  # a bad parameter (a robot's too): 2, else 1
        whose = f"{exc.node}: " if getattr(exc, "node", "") else ""
        print(f"{prog}: {whose}{exc}", file=sys.stderr, flush=True)
        code = 2 if isinstance(exc, ParameterError) or getattr(exc, "code", None) == 2 else 1
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        try:
            session.finish(agent)
        except KeyboardInterrupt:  # a SIGTERM during it: stop now
            pass
        agent.close()
    return code

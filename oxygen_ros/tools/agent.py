"""``oxygen-agent``: the nodes of ``launch/agent.launch.py`` from one command, with a live status line.

Usage::

    oxygen-agent [name:=value ...] [--duration SECONDS] [--report PATH [--probe-priority N]] [--text all|changed|answers|none] [--status-every S]
                 [--executor split|multi] [--background-niceness N] [--[no-]robot-processes]

The arguments are the launch file's (``oxygen_ros.ros.plan_tables.ARGUMENTS``),
written ``name:=value`` like ``ros2 launch`` arguments: ``params_file``
(default: the installed ``config/agent.yaml``), ``model_path``, ``model_sizes``
(a comma list of ``KEY=VALUE`` sizes), ``preset``,
``device``, ``dtype``, ``setting``, ``control_rate_hz``, ``steps_per_frame``
(empty: keep the YAML's value), ``camera_topic`` (remaps
``/camera/image_raw`` of the camera node and the synthetic camera) and
``demo`` (default false: a robot must never act on a synthetic camera by
accident; ``demo:=true`` adds the synthetic camera, and feeds its gripper
position to the camera node as the robot state), ``robots`` (``left,right``:
a camera node, and synthetic camera, per robot in its namespace, one
inference node serving them all; see ``oxygen_ros.ros.robot_plan``). The
nodes run until Ctrl-C
(or SIGTERM) or ``--duration``, spun in background threads: by default
(``--executor split``) every node (inference, camera, synthetic camera, the
monitor) on a ``SingleThreadedExecutor`` of its own, so the control tick never
waits behind another node's callbacks, and the threads of the nodes off the
control path (synthetic camera, monitor) at a lower priority
(``--background-niceness``, see ``oxygen_ros.ros.spinner.Spinner``)
(``--executor multi``: everything on one ``MultiThreadedExecutor``, for
comparison: its wait-set rebuilding in Python keeps most of a core busy, which
on 2 cores delays the frames and the control tick). ``--robot-processes``
(the default with robots, from ``robots:=`` or the params file; ``--no-robot-processes``: all in this process):
every robot's camera side (its camera node and synthetic camera) runs in a
child process of its own instead, as on real robots, the inference node and
the monitor here (:mod:`oxygen_ros.ros.robot_process`); a child that ends
ends the run, naming its robot, and none outlives the agent. With
``respawn:=true`` (which implies ``--robot-processes``) a child that ends is
restarted after ``respawn_delay`` seconds instead, and the other robots run on
(the report counts the restarts); one that ended for a bad parameter, or
that was restarted ``respawn_max_retries`` times already, still ends the run.

While running it prints a status line and the streamed text
(:mod:`.agent_monitor`). ``--report PATH`` writes the run's figures as JSON;
:mod:`.agent_report` describes every field and where it is measured; with
several robots the report has a ``robots`` section and the summary a table
of them (:mod:`.agent_robots_report`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..ros.agent import BACKGROUND_NICENESS, EXECUTORS, Agent, run_agent
from ..ros.plan import parse_launch_args
from ..ros.plan_tables import ARGUMENTS
from ..ros.robots import robot_topic
from .agent_monitor import TEXT_MODES
from .agent_robots_report import robot_names, summary_table
from .arguments import output_file, positive_float, write_output

PROBE_PRIORITY = 0  # normal: at 40, the probe's reception of four robots' messages took the frames' core (docs/control_loop_timing.md)
STARTED = time.monotonic()  # this process's start, as far as the report is concerned
SUMMARY = ("start_to_first_chunk_s", "tick_rate_hz", "tick_jitter_p99_ms", "underruns", "obs_to_action_p50_ms", "obs_to_action_p99_ms",
           "ros_overhead_p99_ms", "actions_published", "text_tokens_published", "control_rate_changed_hz",
           "camera_side_restarts")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, dict[str, str]]:
    names = ", ".join(f"{a.name}:=" for a in ARGUMENTS)
    parser = argparse.ArgumentParser(
        prog="oxygen-agent", description="Run the oxygen_ros nodes from one command, like launch/agent.launch.py (the "
        "control tick, and with robots:= each robot's camera side, in processes of their own).",
        epilog=f"launch arguments: {names}")
    parser.add_argument("launch_args", nargs="*", metavar="name:=value", help="launch arguments")
    parser.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    parser.add_argument("--report", type=output_file, default=None, help="write the JSON report here at the end")
    parser.add_argument("--probe-priority", type=int, default=PROBE_PRIORITY, metavar="N",
                        help=f"--report: run the arrival probe, which stands for a robot's controller, under "
                             f"SCHED_FIFO N where allowed, as a real-time controller runs (default {PROBE_PRIORITY}: "
                             f"normal priority; a real-time probe takes cores from the frames it measures)")
    parser.add_argument("--executor", choices=EXECUTORS, default="split",
                        help="split (default): every node on a single-threaded executor of its own; "
                             "multi: all on one multi-threaded executor")
    parser.add_argument("--background-niceness", type=int, default=BACKGROUND_NICENESS, metavar="N",
                        help=f"split executors: lower the priority of the threads of nodes off the control path "
                             f"(demo source, monitor) by N (default {BACKGROUND_NICENESS}; 0: leave it)")
    parser.add_argument("--robot-processes", action=argparse.BooleanOptionalAction, default=None,
                        help="every robot's camera side (camera node, synthetic camera) in a process of its own, "
                             "as on real robots; the inference node and the monitor stay in this one "
                             "(default: with robots, from robots:= or the params file, or with respawn:=true, "
                             "yes; without, no)")
    parser.add_argument("--text", choices=TEXT_MODES, default="changed",
                        help="which finished texts to print: all, answers and periodic texts that changed "
                             "(default), answers to questions only, none")
    parser.add_argument("--status-every", type=positive_float, default=1.0, metavar="S",
                        help="without a terminal (output to a file or a journal), print the status line every S "
                             "seconds (default 1; a terminal's line is rewritten in place)")
    ns = parser.parse_intermixed_args(argv)  # launch arguments before or after the options
    try:
        values = parse_launch_args(ns.launch_args)
    except ValueError as exc:
        parser.error(str(exc))
    if not 0 <= ns.background_niceness <= 19:
        parser.error(f"--background-niceness must be 0..19, got {ns.background_niceness}")
    if not 0 <= ns.probe_priority <= 99:
        parser.error(f"--probe-priority must be 0..99, got {ns.probe_priority}")
    if ns.duration is not None and not ns.duration > 0:
        parser.error(f"--duration must be > 0, got {ns.duration}")
    return ns, values


class AgentSession:
    """The agent's own part of the start-up: the arrival probe (``--report``), the
    monitor node, the main loop (status line, text) and the report at the end."""

    def __init__(self, ns: argparse.Namespace):
        self.ns = ns
        self.probe = None
        self.monitor = None
        self.report: dict[str, Any] | None = None

    def start(self, agent: Agent) -> None:
        import rclpy

        from .agent_monitor import Monitor
        from .arrival_probe import Probe

        p = agent.inference.params
        if self.ns.report is not None:  # the tick jitter as a subscriber in another process sees it
            streams = {robot or "": (robot_topic(robot, p["actions_topic"]), robot_topic(robot, p["observation_topic"]))
                       for robot in robot_names(agent.inference) or (None,)}
            try:
                self.probe = Probe(streams, Path(tempfile.gettempdir()), self.ns.probe_priority)
            except (OSError, RuntimeError) as exc:
                print(f"oxygen-agent: {exc}; jitter and latency measured in this process", file=sys.stderr)
        node = agent.add(rclpy.create_node("oxygen_agent_monitor"))
        self.monitor = Monitor(node, agent.inference, self.ns.text,
                               measure=self.ns.report is not None and self.probe is None,
                               status_every_s=self.ns.status_every)

    def run(self, agent: Agent) -> int:
        import rclpy

        deadline = None if self.ns.duration is None else time.monotonic() + self.ns.duration
        while rclpy.ok() and agent.alive() and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.05)
            self.monitor.poll()
            self.monitor.status()
        return 0

    def finish(self, agent: Agent) -> None:
        try:
            if self.monitor is not None:
                self.monitor.end_status()
                self.monitor.freeze()  # the measurement window ends here, before the shutdown
            for node in agent.nodes:  # in the plan's order: the cameras stop grouping before inference stops
                if hasattr(node, "shutdown"):
                    node.shutdown()  # the inference node publishes its cancellations
            probed = self.probe.stop() if self.probe is not None else None
            probe_priority = self.probe.priority if self.probe is not None else None
            self.probe = None
            if agent.spinner is not None:
                time.sleep(0.5)  # let the cancellations reach the monitor
            self.report = self.monitor.report(probed) if self.monitor is not None else None
            if self.report is not None:
                first = self.monitor.measurement.first_chunk
                self.report["start_to_first_chunk_s"] = None if first is None else round(first - STARTED, 3)
                self.report["probe_priority"] = probe_priority
                restarts = agent.children.restarts if agent.children.respawn_delay is not None else None
                self.report["camera_side_restarts"] = (
                    None if restarts is None else {robot or "": n for robot, n in restarts.items()})
        finally:
            if self.probe is not None:  # a second Ctrl-C came before it was stopped
                self.probe.stop()


def main(argv: list[str] | None = None) -> int:
    ns, values = parse_args(sys.argv[1:] if argv is None else argv)
    session = AgentSession(ns)
    code = run_agent("oxygen-agent", values, session, ns.executor, ns.background_niceness, ns.robot_processes)
    report = session.report
    if report is not None:
        summary = {k: report[k] for k in SUMMARY if report[k] is not None}  # subscriber-side figures need --report
        print("oxygen-agent: " + json.dumps(summary), flush=True)
        for line in summary_table(report):
            print("oxygen-agent: " + line, flush=True)
        if not report["actions_published"]:  # 0 underruns, 0 missed ticks: it would read as a healthy run
            n = report["observations_received"]
            why = (f"{n} observation(s) reached the inference node, none gave a chunk (refused, or failed frames)"
                   if n else "no observation reached the inference node (a camera or state topic nothing publishes "
                   "on, images or states refused, the camera node waiting for a state)")
            print(f"oxygen-agent: no action chunk was published in this run: {why}; the warnings above say which",
                  file=sys.stderr, flush=True)
        if ns.report is not None:
            if write_output(ns.report, json.dumps(report, indent=2) + "\n", "oxygen-agent"):
                print(f"oxygen-agent: report written to {ns.report}", flush=True)
            else:
                code = code or 1
    elif session.monitor is not None:
        print("oxygen-agent: no figures: the inference node was not configured at the end of the run "
              "(autostart:=false and no configure transition, or a cleanup)", file=sys.stderr, flush=True)
    elif ns.report is not None and code == 0:  # Ctrl-C or SIGTERM while the nodes were being built
        print(f"oxygen-agent: no report written to {ns.report}: interrupted during start-up, before any figure",
              file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())

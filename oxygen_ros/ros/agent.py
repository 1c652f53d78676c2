"""``oxygen-agent``: the nodes of ``launch/agent.launch.py`` in one process, with a live status line.

Usage::

    oxygen-agent [name:=value ...] [--duration SECONDS] [--report PATH] [--text all|changed|none]
                 [--executor split|multi]

The arguments are the launch file's (:data:`ARGUMENTS`), written
``name:=value`` like ``ros2 launch`` arguments: ``params_file`` (default: the
installed ``config/agent.yaml``), ``model_path``, ``preset``, ``device``,
``dtype``, ``setting``, ``control_rate_hz``, ``steps_per_frame`` (empty: keep
the YAML's value), ``camera_topic`` (remaps ``/camera/image_raw`` of the
camera node and the synthetic camera) and ``demo`` (default false: a robot
must never act on a synthetic camera by accident; ``demo:=true`` adds the
synthetic camera, and feeds its gripper position to the camera node as the
robot state, :data:`DEMO_PARAMETERS`). The nodes (:data:`NODES`) run until
Ctrl-C (or SIGTERM) or ``--duration``, spun in background threads: by default
(``--executor split``) every node (inference, camera, synthetic camera, the
monitor) on a ``SingleThreadedExecutor`` of its own, so the control tick never
waits behind another node's callbacks, and the threads of the nodes off the
control path (synthetic camera, monitor) at a lower priority
(``--background-niceness``, see :class:`Spinner`) (``--executor multi``:
everything on one ``MultiThreadedExecutor``, for comparison: its wait-set
rebuilding in Python keeps most of a core busy, which on 2 cores delays the
frames and the control tick).

While running it prints a status line (action frequency f = H/T, chunk age,
active batch, tokens/s, from the inference node's ``/diagnostics``) and the
streamed text: every finished language request (answers to questions always;
periodic ones when their text changed, or all with ``--text all``).

``--report PATH`` writes JSON (see :func:`Monitor.report`); where each figure
is measured:

* ``tick_rate_hz`` - node side: control ticks counted by the inference node
  over the measurement window (first ActionChunk published .. end) / its length;
* ``tick_jitter_p50_ms`` / ``tick_jitter_p99_ms`` - subscriber side:
  ``|inter-arrival - control period|`` of consecutive ``ActionChunk`` messages
  on ``actions_topic`` as received by a subscriber in a process of its own
  (:mod:`.arrival_probe`, what a controller sees: the node's tick latency plus
  DDS delivery; ``measured_by`` says so). Only if the probe cannot start does
  the monitor in this process subscribe to the actions and observations and
  measure them itself (``measured_by: agent process``; its threads share the
  interpreter lock with the inference worker, so it sees more jitter); without
  ``--report`` nothing subscribes to them here. ``tick_lateness_*_ms`` is the
  node-side part alone (timer callback start - scheduled time);
* ``underruns`` - node side: ticks with no action left in the window;
  ``missed_ticks``: ticks rcl skipped because the timer callback was more
  than a period late (they count neither as ticks nor as underruns);
* ``obs_to_action_p50_ms`` / ``_p99_ms`` - subscriber side, in the probe's
  process too: arrival of an ``Observation`` -> arrival of the first
  ``ActionChunk`` computed from it (matched by ``observation_seq``);
* ``ros_overhead_p99_ms`` (and ``_p50_ms``) - what ROS adds: that latency
  minus, for the same frame (read from the node in this process), the
  engine's frame time (``Engine.step``'s wall time, which includes the time the
  frame stepped aside for control ticks, reported as ``paused_*_ms``;
  ``ros_overhead_with_pauses_*_ms`` counts them as ROS's), the wait for the worker
  (``queue_wait``: a frame was still running when the observation came) and
  the wait for the control tick that first publishes the chunk
  (``tick_wait``: actions go out on the tick grid, at most one period). What
  is left is DDS delivery both ways, the callbacks' scheduling and the message
  conversions (``conversion_*_ms``, the part inside the node). The three
  parts are reported too (``queue_wait_*``, ``tick_wait_*``, ``conversion_*``,
  ``paused_*``, p50/p99 over the frames in the window), so that
  ``obs_to_action = ros_overhead + queue_wait + engine + tick_wait`` per frame;
* ``actions_published`` / ``text_tokens_published`` - node-side counts in the
  window; ``actions_received`` is the measuring subscriber's count in the
  window, ``text_tokens_received`` the monitor's (it prints the text).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PACKAGE = "oxygen_ros"
CAMERA_TOPIC = "/camera/image_raw"  # the name `camera_topic` remaps
TRUE = ("true", "1", "yes", "on")
FALSE = ("false", "0", "no", "off")


@dataclass(frozen=True)
class NodeSpec:
    executable: str  # lib/oxygen_ros/<executable>
    name: str  # node name (and its section in the YAML)
    module: str
    cls: str
    demo_only: bool = False
    remap_camera: bool = False  # takes the camera_topic remapping


@dataclass(frozen=True)
class Argument:
    name: str
    default: str
    description: str
    node: str | None = None  # node whose parameter it overrides (when not empty)
    parameter: str | None = None


#: The nodes of the launch file and the agent, in start order.
NODES: tuple[NodeSpec, ...] = (
    NodeSpec("synthetic_camera", "oxygen_synthetic_camera", "oxygen_ros.ros.sources", "SyntheticCamera",
             demo_only=True, remap_camera=True),
    NodeSpec("camera_node", "oxygen_camera", "oxygen_ros.ros.camera_node", "CameraNode", remap_camera=True),
    NodeSpec("inference_node", "oxygen_inference", "oxygen_ros.ros.inference_node", "InferenceNode"),
)

#: The launch arguments. An empty value means "keep the parameters file's value".
ARGUMENTS: tuple[Argument, ...] = (
    Argument("params_file", "", "Parameters YAML of every node (default: the installed config/agent.yaml)."),
    Argument("model_path", "", "Checkpoint directory (empty: the YAML's, by default the embedded model).",
             "oxygen_inference", "model_path"),
    Argument("preset", "", "Random-weights preset when there is no model (tiny | pi05).",
             "oxygen_inference", "preset"),
    Argument("device", "", "Torch device (cpu | cuda | cuda:N).", "oxygen_inference", "device"),
    Argument("dtype", "", "Model precision (float32 | bfloat16).", "oxygen_inference", "dtype"),
    Argument("setting", "", "Frame setting (oxygen | shared_kv | parallel | baseline).",
             "oxygen_inference", "setting"),
    Argument("control_rate_hz", "", "Control-loop rate in Hz.", "oxygen_inference", "control_rate_hz"),
    Argument("steps_per_frame", "", "Decode steps per frame (k).", "oxygen_inference", "steps_per_frame"),
    Argument("camera_topic", "", f"Camera image topic: remaps {CAMERA_TOPIC} of the camera node and the "
             "synthetic camera (empty: no remapping)."),
    Argument("demo", "false", "true: also start the synthetic closed-loop camera (never on a robot)."),
)

#: With demo:=true, the camera node also takes the synthetic camera's gripper
#: position as the robot state (closing the loop the way the model was trained).
DEMO_PARAMETERS: dict[str, dict[str, Any]] = {
    # the synthetic camera renders 32 px images for the embedded tiny model: pass
    # them on at that size instead of upscaling them to the YAML's 224
    "oxygen_camera": {"state_topic": "/joint_states", "image_size": 32},
}


# --------------------------------------------------------------------------
# Shared with the launch file
# --------------------------------------------------------------------------


def default_params_file() -> str:
    """The installed ``share/oxygen_ros/config/agent.yaml``, else the one next to the sources."""
    try:
        from ament_index_python.packages import (
            PackageNotFoundError,
            get_package_share_directory,
        )

        try:
            path = Path(get_package_share_directory(PACKAGE)) / "config" / "agent.yaml"
            if path.is_file():
                return str(path)
        except (PackageNotFoundError, OSError):  # OSError: AMENT_PREFIX_PATH unset
            pass
    except ImportError:
        pass
    return str(Path(__file__).resolve().parents[2] / "config" / "agent.yaml")


def parse_bool(name: str, value: str) -> bool:
    v = str(value).strip().lower()
    if v in TRUE:
        return True
    if v in FALSE:
        return False
    raise ValueError(f"argument '{name}': expected true or false, got {value!r}")


def parse_value(text: str) -> Any:
    """A launch-argument string as a parameter value, typed the way ``ros2 launch``
    and ``-p name:=value`` type it (YAML: 50 -> int, 50.0 -> float, true -> bool)."""
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return text if value is None or isinstance(value, (dict, list)) and not value else value


def node_plan(values: dict[str, str]) -> list[dict[str, Any]]:
    """What to start for the given argument values (missing ones: defaults):
    ``[{spec, parameters: {name: value}, remappings: [(from, to)]}]``."""
    args = {a.name: a.default for a in ARGUMENTS}
    unknown = sorted(set(values) - set(args))
    if unknown:
        raise ValueError(f"unknown argument(s) {unknown}; known: {sorted(args)}")
    args.update(values)
    demo = parse_bool("demo", args["demo"])
    plan = []
    for spec in NODES:
        if spec.demo_only and not demo:
            continue
        overrides = dict(DEMO_PARAMETERS.get(spec.name, {})) if demo else {}
        overrides.update({a.parameter: parse_value(args[a.name]) for a in ARGUMENTS
                          if a.node == spec.name and args[a.name] != ""})
        remaps = [(CAMERA_TOPIC, args["camera_topic"])] if spec.remap_camera and args["camera_topic"] else []
        plan.append({"spec": spec, "parameters": overrides, "remappings": remaps})
    return plan


def resolve(values: dict[str, str]) -> tuple[list[dict[str, Any]], str]:
    """The node plan and the parameters file for the given argument values; ValueError
    naming what is wrong (an unknown argument, a bad value, a missing parameters file)."""
    plan = node_plan(values)
    params_file = values.get("params_file") or default_params_file()
    if not Path(params_file).is_file():
        raise ValueError(f"parameters file {params_file} not found")
    return plan, params_file


def build_nodes(plan: list[dict[str, Any]], params_file: str, nodes: list) -> list:
    """Construct the nodes of ``plan`` (see :func:`node_plan`) with ``params_file``,
    appending each to ``nodes`` as it is made (so a caller can destroy those already
    made if a later one fails); returns ``nodes``."""
    import importlib

    from rclpy.parameter import Parameter

    for item in plan:
        spec = item["spec"]
        cls = getattr(importlib.import_module(spec.module), spec.cls)
        cli = ["--ros-args", "--params-file", params_file]
        for src, dst in item["remappings"]:
            cli += ["-r", f"{src}:={dst}"]
        overrides = [Parameter(k, value=v) for k, v in item["parameters"].items()]
        nodes.append(cls(cli_args=cli, parameter_overrides=overrides))
    return nodes


# --------------------------------------------------------------------------
# Monitor: status line, text, report
# --------------------------------------------------------------------------


def _pct(values, q):
    from ..core.stats import percentile

    v = percentile(values, q)
    return None if math.isnan(v) else round(v, 3)


class Monitor:
    """Prints the status line (from ``/diagnostics``) and the streamed text, and keeps
    what the report needs. Subscribes to the actions and observations only with
    ``measure`` (a report whose arrival probe could not start)."""

    def __init__(self, node, inference, text_mode: str = "changed", out=sys.stdout, measure: bool = False):
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.qos import QoSProfile, ReliabilityPolicy

        from oxygen_ros.msg import ActionChunk, TextToken
        from oxygen_ros.msg import Observation as ObservationMsg

        self.node, self.inference, self.text_mode, self.out = node, inference, text_mode, out
        self.lock = threading.Lock()
        p = inference.params
        self.period_s = 1.0 / p["control_rate_hz"]
        self.actions: list[tuple[float, int, int]] = []  # (arrival, frame_id, observation_seq)
        self.obs_arrival: dict[int, float] = {}
        self.latencies: list[tuple[int, int, float]] = []  # (frame_id, seq, obs->action ms)
        self.seen_frames: set[int] = set()
        self.text_received = 0
        self.requests: dict[int, list[str]] = {}
        self.last_periodic = None
        self.diag: dict[str, str] = {}
        self.window_start: dict[str, Any] | None = None
        self.window_end: dict[str, Any] | None = None
        self.partial = ""
        reliable = lambda n: QoSProfile(depth=n, reliability=ReliabilityPolicy.RELIABLE)  # noqa: E731
        node.create_subscription(TextToken, p["text_topic"], self._on_text, reliable(1000))
        node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, reliable(10))
        # Actions and observations only when this process must measure them itself (a
        # report without the arrival probe): every subscription here is one more
        # callback, and for observations one more image deserialised, in the process
        # that runs the control loop, at the moments the control path is busy.
        self.measure = measure
        if measure:
            node.create_subscription(ActionChunk, p["actions_topic"], self._on_actions, reliable(50))
            node.create_subscription(ObservationMsg, p["observation_topic"], self._on_observation, reliable(10))
        self.tty = hasattr(out, "isatty") and out.isatty()
        self._last_status = 0.0
        self._status_len = 0

    # -- callbacks
    def _on_observation(self, msg) -> None:
        with self.lock:
            self.obs_arrival[int(msg.seq)] = time.monotonic()

    def poll(self) -> None:
        """Start the measurement window at the first ActionChunk the node published
        (called by the main loop; with ``measure``, the first one received starts it)."""
        if self.window_start is None and self.inference.tick_counts()["published"] > 0:
            with self.lock:
                self._start_window(time.monotonic())

    def _start_window(self, t: float) -> None:
        if self.window_start is None:
            ticks = self.inference.tick_counts()
            self.window_start = {"t": t, "t_ns": time.monotonic_ns(), "ticks": ticks["ticks"],
                                 "underruns": ticks["underruns"], "counters": dict(self.inference.counters),
                                 "lateness_total": self.inference.tick_lateness_ms.total}

    def _on_actions(self, msg) -> None:
        t = time.monotonic()
        with self.lock:
            self._start_window(t)
            self.actions.append((t, int(msg.frame_id), int(msg.observation_seq)))
            if msg.frame_id not in self.seen_frames:
                self.seen_frames.add(int(msg.frame_id))
                t_obs = self.obs_arrival.pop(int(msg.observation_seq), None)
                if t_obs is not None:
                    self.latencies.append((int(msg.frame_id), int(msg.observation_seq), (t - t_obs) * 1e3))

    def _on_text(self, msg) -> None:
        with self.lock:
            self.text_received += 1
            pieces = self.requests.setdefault(int(msg.request_id), [])
            pieces.append(msg.piece)
            text = "".join(pieces)
            self.partial = text
            if not msg.done:
                return
            del self.requests[int(msg.request_id)]
        who = f"client {msg.client_id!r}" if msg.client_id else f"frame {msg.frame_id}"
        line = f"[request {msg.request_id}, {who}, {msg.finish_reason}] {text!r}"
        if self.text_mode == "none":
            return
        if not msg.client_id and self.text_mode == "changed":
            if text == self.last_periodic:
                return
            self.last_periodic = text
        self._print_line(line)

    def _on_diagnostics(self, msg) -> None:
        for status in msg.status:
            if status.name.startswith(self.inference.get_name()):
                with self.lock:
                    self.diag = {kv.key: kv.value for kv in status.values}

    # -- output
    def _print_line(self, line: str) -> None:
        if self.tty and self._status_len:
            self.out.write("\r" + " " * self._status_len + "\r")
        self.out.write(line + "\n")
        self.out.flush()
        self._status_len = 0

    def status(self) -> None:
        """Print the status line (overwritten in place on a terminal, once a second otherwise)."""
        now = time.monotonic()
        if not self.tty and now - self._last_status < 1.0:
            return
        self._last_status = now
        with self.lock:
            d = dict(self.diag)
            partial = self.partial
        if not d:
            line = "waiting for the inference node's diagnostics ..."
        else:
            line = (f"f={_num(d.get('action_frequency_hz'))} Hz  chunk age {_num(d.get('chunk_age_ms'))} ms  "
                    f"frame {_num(d.get('frame_latency_ms'), 1)} ms  batch {d.get('active_batch', '?')}  "
                    f"{_num(d.get('tokens_per_s'))} tok/s  underruns {d.get('underruns', '?')}  "
                    f"| {partial[-40:]!r}")
        if self.tty:
            self.out.write("\r" + line.ljust(self._status_len))
            self._status_len = len(line)
        else:
            self.out.write(line + "\n")
        self.out.flush()

    def end_status(self) -> None:
        if self.tty and self._status_len:
            self.out.write("\n")
            self.out.flush()
            self._status_len = 0

    # -- report
    def freeze(self) -> None:
        """End the measurement window: keep the node's counts as they are now."""
        node = self.inference
        with self.lock:
            self.window_end = {"t": time.monotonic(), "ticks": node.tick_counts(), "counters": dict(node.counters),
                               "lateness": node.tick_lateness_ms.values(),
                               "lateness_total": node.tick_lateness_ms.total, "actions": len(self.actions)}

    def _jitter(self, arrivals: list[float]) -> list[float]:
        """|inter-arrival - control period| (ms) of consecutive ActionChunks."""
        return [abs((b - a) - self.period_s) * 1e3 for a, b in zip(arrivals, arrivals[1:])]

    def report(self, probed: dict[str, Any] | None = None) -> dict[str, Any]:
        """The figures described in the module doc (``None`` where nothing was measured).
        ``probed``: what :mod:`.arrival_probe` recorded in its own process."""
        node = self.inference
        if self.window_end is None:
            self.freeze()
        with self.lock:
            final = self.window_end
            arrivals = [t for t, _, _ in self.actions[:final["actions"]]]
            start = self.window_start
            latencies = list(self.latencies)
            text_received = self.text_received
        end = final["t"]
        if probed is not None and start is not None:
            arrivals = [t for t in probed["arrivals"] if start["t"] <= t <= end]
            obs = probed["observations"]
            latencies = sorted((f, seq, (t - obs[seq]) * 1e3) for f, (seq, t) in probed["first_actions"].items()
                               if seq in obs and start["t"] <= t <= end)
            measured_by = "arrival_probe (own process)"
        else:
            measured_by = "agent process" if self.measure else None
        jitter = self._jitter(arrivals)
        records = node.frame_records()
        parts = {f: _latency_parts(records[f]) for f, _, _ in latencies
                 if f in records and records[f].first_published_ns is not None}
        # subscriber-side latency minus what is not ROS: the engine's frame, the wait for the
        # worker (a frame already running) and the wait for the control tick that publishes it
        per_frame = [(lat - p["engine"] - p["queue_wait"] - p["tick_wait"], p["paused"])
                     for f, _, lat in latencies if (p := parts.get(f)) is not None]
        overhead = [x for x, _ in per_frame]
        with_pauses = [x + paused for x, paused in per_frame]
        in_window = [_latency_parts(r) for r in records.values()
                     if r.first_published_ns is not None and (start is None or r.received_ns >= start["t_ns"])]
        lateness = final["lateness"]
        if start is not None:
            new_lateness = final["lateness_total"] - start["lateness_total"]
            lateness = lateness[-new_lateness:] if new_lateness > 0 else []
        counters = final["counters"]
        base = start["counters"] if start else {}
        window = (end - start["t"]) if start else 0.0
        d = node.diagnostics()
        ticks = final["ticks"]
        return {
            "duration_s": round(window, 3),
            "control_rate_hz": node.params["control_rate_hz"],
            "setting": node.params["setting"],
            "k": node.params["steps_per_frame"],
            "horizon": node.horizon,
            "model": node.loaded.source,
            "tick_rate_hz": round((ticks["ticks"] - start["ticks"]) / window, 3) if window > 0 else None,
            "tick_jitter_p50_ms": _pct(jitter, 50),
            "tick_jitter_p99_ms": _pct(jitter, 99),
            "measured_by": measured_by,
            "tick_lateness_p50_ms": _pct(lateness, 50),
            "tick_lateness_p99_ms": _pct(lateness, 99),
            "underruns": ticks["underruns"] - (start["underruns"] if start else 0),
            "missed_ticks": counters.get("missed_ticks", 0) - base.get("missed_ticks", 0),
            "obs_to_action_p50_ms": _pct([x for _, _, x in latencies], 50),
            "obs_to_action_p99_ms": _pct([x for _, _, x in latencies], 99),
            "ros_overhead_p50_ms": _pct(overhead, 50),
            "ros_overhead_p99_ms": _pct(overhead, 99),
            "ros_overhead_with_pauses_p50_ms": _pct(with_pauses, 50),
            "ros_overhead_with_pauses_p99_ms": _pct(with_pauses, 99),
            **{f"{name}_p{q}_ms": _pct([x[name] for x in in_window], q)
               for name in ("queue_wait", "tick_wait", "conversion", "paused") for q in (50, 99)},
            "frame_latency_mean_ms": _round(d["frame_latency_ms"]),
            "frame_latency_p99_ms": _round(d["frame_latency_p99_ms"]),
            "action_frequency_hz": _round(d["action_frequency_hz"]),
            "frames": counters.get("frames", 0) - base.get("frames", 0),
            "actions_published": counters.get("actions_published", 0) - base.get("actions_published", 0),
            "actions_received": len(arrivals),
            "text_tokens_published": (counters.get("text_tokens_published", 0)
                                      - base.get("text_tokens_published", 0)),
            "text_tokens_received": text_received,
            "text_tokens_published_total": node.counters.get("text_tokens_published", 0),
            "observations_received": counters.get("observations_received", 0),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        }


class Probe:
    """:mod:`.arrival_probe` in a child process, for ``--report``: started before the
    nodes spin, stopped (SIGINT) at the end of the measurement window; never left running."""

    def __init__(self, actions_topic: str, observation_topic: str, workdir: Path):
        import subprocess

        self.out = workdir / f"oxygen_arrivals_{os.getpid()}.json"
        self.proc = subprocess.Popen([sys.executable, "-m", "oxygen_ros.ros.arrival_probe", actions_topic,
                                      observation_topic, str(self.out)], stdout=subprocess.PIPE, text=True)
        import select

        started = select.select([self.proc.stdout], [], [], 30.0)[0]  # its rclpy start-up takes ~1 s
        ready = self.proc.stdout.readline().strip() if started else ""
        if ready != "arrival probe ready":
            self.stop()
            raise RuntimeError(f"the arrival probe did not start (exit code {self.proc.returncode})")

    def stop(self) -> dict[str, Any] | None:
        """End the probe; what it recorded (see :mod:`.arrival_probe`), or None."""
        import signal
        import subprocess

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


def _latency_parts(r) -> dict[str, float]:
    """Where one frame's observation-to-first-action time went inside the inference
    node (ms): ``queue_wait`` (callback -> the worker takes it: a frame was running),
    ``conversion`` (message -> model input, and the engine's result -> chunk),
    ``engine`` (``Engine.step``'s wall time; ``paused`` is the part of it spent
    stepping aside for control ticks, ``yield_to_ticks``), ``tick_wait`` (frame
    end -> the control tick that first publishes its chunk)."""
    total = (r.finished_ns - r.dequeued_ns) / 1e6
    return {"queue_wait": (r.dequeued_ns - r.received_ns) / 1e6, "engine": r.engine_ms,
            "paused": r.paused_ms, "conversion": total - r.engine_ms,
            "tick_wait": (r.first_published_ns - r.finished_ns) / 1e6}


def _num(value, digits=0):
    try:
        v = float(value)
    except (TypeError, ValueError):
        return "?"
    return "?" if math.isnan(v) else f"{v:.{digits}f}"


def _round(v):
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(v, 3)


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------


EXECUTORS = ("split", "multi")


#: The nodes on the path camera -> observation -> frame -> ActionChunk. In the
#: ``split`` layout every other node (the synthetic camera or bag player, the
#: monitor) spins on a thread of lower CPU priority (``--background-niceness``).
CONTROL_PATH = ("oxygen_camera", "oxygen_inference")
BACKGROUND_NICENESS = 10


class Spinner:
    """Spins the nodes in background threads (so that the main thread only prints
    and waits for Ctrl-C), with the executor layout chosen by ``--executor``.

    ``split`` (default): one ``SingleThreadedExecutor`` and thread per node. The
    threads of nodes off the control path (:data:`CONTROL_PATH`) lower their own
    scheduling priority by ``background_niceness`` (Linux, where a thread has a
    niceness of its own; 0 leaves it): on a machine with few cores, the demo
    source and the status monitor then wait for a free core instead of taking it
    from the control tick, the observation hand-off or a controller in another
    process at the moments all of them wake together (every ActionChunk wakes the
    synthetic camera's subscriber too). Raising niceness needs no privilege."""

    def __init__(self, mode: str, inference, monitor, others, background_niceness: int = BACKGROUND_NICENESS):
        from rclpy.executors import MultiThreadedExecutor, SingleThreadedExecutor

        if mode == "multi":
            groups = [(MultiThreadedExecutor(num_threads=4), [inference, monitor, *others])]
        else:  # split: the control tick (and the measuring subscriber) never wait behind other nodes' callbacks
            groups = [(SingleThreadedExecutor(), [node]) for node in (inference, monitor, *others)]
        self.executors = []
        self.threads = []
        for executor, nodes in groups:
            for node in nodes:
                executor.add_node(node)
            niceness = 0
            if (mode != "multi" and background_niceness > 0 and sys.platform.startswith("linux")
                    and not any(n.get_name() in CONTROL_PATH for n in nodes)):
                niceness = background_niceness
            thread = threading.Thread(target=self._spin, args=(executor, niceness), daemon=True,
                                      name=f"oxygen-agent-{type(executor).__name__}")
            self.executors.append(executor)
            self.threads.append(thread)
        self.error: BaseException | None = None
        for thread in self.threads:
            thread.start()

    def _spin(self, executor, niceness: int = 0) -> None:
        from rclpy.executors import ExternalShutdownException

        if niceness:
            try:  # this thread only (Linux: a thread's id is a process id for setpriority)
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(),
                               os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) + niceness)
            except OSError as exc:  # a sandbox may forbid it: run at normal priority
                print(f"oxygen-agent: could not lower a background thread's priority: {exc}", file=sys.stderr)
        try:
            executor.spin()
        except ExternalShutdownException:
            pass
        except BaseException as exc:  # reported by alive()
            self.error = exc
            raise

    def alive(self) -> bool:
        if self.error is not None:
            raise RuntimeError(f"an executor stopped: {self.error!r}") from self.error
        return all(t.is_alive() for t in self.threads)

    def shutdown(self) -> None:
        for executor in self.executors:
            executor.shutdown()
        for thread in self.threads:
            thread.join(5.0)


def _parse_args(argv: list[str]) -> tuple[argparse.Namespace, dict[str, str]]:
    names = ", ".join(f"{a.name}:=" for a in ARGUMENTS)
    parser = argparse.ArgumentParser(
        prog="oxygen-agent", description="Run the oxygen_ros nodes in one process (like launch/agent.launch.py).",
        epilog=f"launch arguments: {names}")
    parser.add_argument("launch_args", nargs="*", metavar="name:=value", help="launch arguments")
    parser.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    parser.add_argument("--report", type=Path, default=None, help="write the JSON report here at the end")
    parser.add_argument("--executor", choices=EXECUTORS, default="split",
                        help="split (default): every node on a single-threaded executor of its own; "
                             "multi: all on one multi-threaded executor")
    parser.add_argument("--background-niceness", type=int, default=BACKGROUND_NICENESS, metavar="N",
                        help=f"split executors: lower the priority of the threads of nodes off the control path "
                             f"(demo source, monitor) by N (default {BACKGROUND_NICENESS}; 0: leave it)")
    parser.add_argument("--text", choices=("all", "changed", "none"), default="changed",
                        help="which finished texts to print (default: answers and changed periodic texts)")
    ns = parser.parse_intermixed_args(argv)  # launch arguments before or after the options
    values = {}
    for item in ns.launch_args:
        if ":=" not in item:
            parser.error(f"expected name:=value, got {item!r}")
        name, value = item.split(":=", 1)
        values[name.strip()] = value
    if not 0 <= ns.background_niceness <= 19:
        parser.error(f"--background-niceness must be 0..19, got {ns.background_niceness}")
    if ns.duration is not None and not ns.duration > 0:
        parser.error(f"--duration must be > 0, got {ns.duration}")
    return ns, values


def main(argv: list[str] | None = None) -> int:
    ns, values = _parse_args(sys.argv[1:] if argv is None else argv)
    try:
        plan, params_file = resolve(values)
    except ValueError as exc:
        print(f"oxygen-agent: {exc}", file=sys.stderr)
        return 2

    import rclpy
    from rclpy.executors import ExternalShutdownException

    from .camera_node import ParameterError
    from .inference_node import init_control_process, settle_garbage_collector

    init_control_process([])
    nodes, monitor, spinner, probe, code = [], None, None, None, 0
    print(f"oxygen-agent: parameters from {params_file}; nodes: "
          + ", ".join(item["spec"].name for item in plan), flush=True)
    try:
        build_nodes(plan, params_file, nodes)
        inference = next(n for n in nodes if n.get_name() == "oxygen_inference")
        if ns.report is not None:  # the tick jitter as a subscriber in another process sees it
            import tempfile

            try:
                probe = Probe(inference.params["actions_topic"], inference.params["observation_topic"],
                              Path(tempfile.gettempdir()))
            except (OSError, RuntimeError) as exc:
                print(f"oxygen-agent: {exc}; jitter and latency measured in this process", file=sys.stderr)
        monitor_node = rclpy.create_node("oxygen_agent_monitor")
        nodes.append(monitor_node)
        monitor = Monitor(monitor_node, inference, ns.text, measure=ns.report is not None and probe is None)
        settle_garbage_collector()
        spinner = Spinner(ns.executor, inference, monitor_node,
                          [n for n in nodes if n is not inference and n is not monitor_node],
                          background_niceness=ns.background_niceness)
        deadline = None if ns.duration is None else time.monotonic() + ns.duration
        while rclpy.ok() and spinner.alive() and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.05)
            monitor.poll()
            monitor.status()
    except ParameterError as exc:
        print(f"oxygen-agent: {exc}", file=sys.stderr)
        code = 2
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if monitor is not None:
            monitor.end_status()
            monitor.freeze()  # the measurement window ends here, before the shutdown
        report = None
        try:
            for node in nodes:
                if hasattr(node, "shutdown"):
                    node.shutdown()  # the inference node publishes its cancellations
            probed = probe.stop() if probe is not None else None
            probe = None
            if spinner is not None:
                time.sleep(0.5)  # let the cancellations reach the monitor
            report = monitor.report(probed) if monitor is not None else None
        except KeyboardInterrupt:  # a second Ctrl-C: stop now
            pass
        if probe is not None:  # a second Ctrl-C came before it was stopped
            probe.stop()
        if spinner is not None:
            spinner.shutdown()
        for node in reversed(nodes):
            node.destroy_node()
        rclpy.try_shutdown()
    if report is not None:
        summary = {k: report[k] for k in ("tick_rate_hz", "tick_jitter_p99_ms", "underruns",
                                          "obs_to_action_p50_ms", "obs_to_action_p99_ms", "ros_overhead_p99_ms",
                                          "actions_published", "text_tokens_published")
                   if report[k] is not None}  # subscriber-side figures need --report
        print("oxygen-agent: " + json.dumps(summary), flush=True)
        if ns.report is not None:
            ns.report.parent.mkdir(parents=True, exist_ok=True)
            ns.report.write_text(json.dumps(report, indent=2) + "\n")
            print(f"oxygen-agent: report written to {ns.report}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())

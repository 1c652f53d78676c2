"""What ``oxygen-agent`` prints while it runs: the status line and the streamed text.

The :class:`Monitor` is a node of the agent process. It subscribes to the
inference node's ``/diagnostics`` (the status line: action frequency f = H/T,
chunk age, frame time, the mean decode batch of the last frame that decoded,
tokens/s, underruns) and text topic (every finished language request: answers
to questions always, periodic ones when their text changed, or all with
``--text all``), and keeps the measurement window of the report
(:class:`.agent_report.Measurement`). It subscribes to the actions and
observations only with ``measure`` (a report whose arrival probe could not
start): every subscription here is one more callback, and for observations one
more image deserialised, in the process that runs the control loop, at the
moments the control path is busy.

When the inference node serves several robots it takes every robot's text
topic (``/<robot>/oxygen/text``; the printed texts name the robot) and each
robot's status (``oxygen_inference: robot <name>``), shown briefly on the
status line (``[left f=50 age 12 ur 0 20 tok/s]``).
"""

from __future__ import annotations

import math
import sys
import threading
import time
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray
from rclpy.qos import QoSProfile, ReliabilityPolicy

from oxygen_ros.msg import ActionChunk, TextToken
from oxygen_ros.msg import Observation as ObservationMsg

from ..ros.inference_status import inactive_kept
from ..ros.robots import robot_topic
from .agent_report import Measurement
from .agent_robots_report import robot_names

#: which finished texts are printed: every one, answers and periodic texts that changed, answers only, none
TEXT_MODES = ("all", "changed", "answers", "none")


def _reliable(depth: int) -> QoSProfile:
    return QoSProfile(depth=depth, reliability=ReliabilityPolicy.RELIABLE)


class Monitor:
    """Prints the status line and the streamed text of the inference node ``inference``
    to ``out`` with the subscriptions of ``node``, and measures the run for the report."""

    def __init__(self, node, inference, text_mode: str = "changed", out=sys.stdout, measure: bool = False,
                 status_every_s: float = 1.0):
        if text_mode not in TEXT_MODES:
            raise ValueError(f"text mode {text_mode!r}: expected one of {TEXT_MODES}")
        self.node, self.inference, self.text_mode, self.out = node, inference, text_mode, out
        self.status_every_s = status_every_s  # without a terminal: the status line at most this often
        self.lock = threading.Lock()
        self.measurement = Measurement(inference, measure)
        self.text_received = 0
        self.requests: dict[int, list[str]] = {}
        self.last_periodic: dict[str | None, str] = {}  # per robot
        self.diag: dict[str, str] = {}
        self.robot_diag: dict[str, dict[str, str]] = {}
        self.partial = status_text(None, "")  # the newest text so far, as the status line ends it
        p = inference.params
        self.robots = robot_names(inference)
        for robot in self.robots or (None,):
            node.create_subscription(TextToken, robot_topic(robot, p["text_topic"]),
                                     lambda msg, r=robot: self._on_text(msg, r), _reliable(1000))
        node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, _reliable(10))
        if measure and not self.robots:  # with robots, only the arrival probe measures
            m = self.measurement
            node.create_subscription(ActionChunk, p["actions_topic"], m.on_actions, _reliable(50))
            node.create_subscription(ObservationMsg, p["observation_topic"], m.on_observation, _reliable(10))
        self.tty = hasattr(out, "isatty") and out.isatty()
        self._last_status = 0.0
        self._status_len = 0
        self._last_line = ""  # the status line last printed (without a terminal, a wait is printed once)

    # -- the report's window (see :mod:`.agent_report`)
    def poll(self) -> None:
        """Start the measurement window once the node published its first ActionChunk."""
        self.measurement.poll()

    def freeze(self) -> None:
        """End the measurement window (before the nodes shut down)."""
        self.measurement.freeze()

    def report(self, probed: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """The report's figures; ``probed``: what the arrival probe recorded, or None. None when
        the inference node is not configured at the end (nothing of its run can be read)."""
        with self.lock:
            text_received = self.text_received
        return self.measurement.report(probed, text_received)

    # -- callbacks
    def _on_text(self, msg, robot: str | None = None) -> None:
        key = (robot, int(msg.request_id))
        with self.lock:
            self.text_received += 1
            pieces = self.requests.setdefault(key, [])
            pieces.append(msg.piece)
            text = "".join(pieces)
            self.partial = status_text(robot, text)
            if not msg.done:
                return
            del self.requests[key]
        who = f"client {msg.client_id!r}" if msg.client_id else f"frame {msg.frame_id}"
        finish = f"{msg.finish_reason}: {msg.reason}" if msg.reason else msg.finish_reason
        line = f"[{f'{robot} ' if robot else ''}request {msg.request_id}, {who}, {finish}] {text!r}"
        if self.text_mode == "none" or (self.text_mode == "answers" and not msg.client_id):
            return
        if not msg.client_id and self.text_mode == "changed":
            if text == self.last_periodic.get(robot):
                return
            self.last_periodic[robot] = text
        self._print_line(line)

    def _on_diagnostics(self, msg) -> None:
        engine, robot_status = self.inference.status_name("engine"), self.inference.status_name("robot ")
        for status in msg.status:
            values = {kv.key: kv.value for kv in status.values}
            with self.lock:
                if status.name.startswith(robot_status):
                    self.robot_diag[status.name[len(robot_status):]] = values
                elif status.name == engine:
                    self.diag = values

    # -- output
    def _print_line(self, line: str) -> None:
        if self.tty and self._status_len:
            self.out.write("\r" + " " * self._status_len + "\r")
        self.out.write(line + "\n")
        self.out.flush()
        self._status_len = 0

    def status(self) -> None:
        """Print the status line (overwritten in place on a terminal, every :attr:`status_every_s`
        otherwise)."""
        now = time.monotonic()
        if not self.tty and now - self._last_status < self.status_every_s:
            return
        self._last_status = now
        with self.lock:
            d = dict(self.diag)
            # one robot of its own name has no status of its own: the node's is its
            robots = {r: dict(self.robot_diag.get(r) or (self.diag if len(self.robots) == 1 else {}))
                      for r in self.robots}
            partial = self.partial
        frame = f"frame {_num(d.get('frame_latency_ms'), 1)} ms  decode batch {_num(d.get('decode_batch_mean'), 1)}"
        inactive = d.get("lifecycle_state") == "inactive"
        if not self.inference.configured:  # at start (autostart:=false), after a cleanup or a failed configure
            error = getattr(self.inference, "configure_error", None)
            line = ("the inference node is not configured: waiting for its configure transition ..." if error is None
                    else f"the inference node is not configured: its last configure failed: {error}")
        elif not self.inference.active:
            kept = inactive_kept(d) if inactive and "active_requests" in d else "its questions and requests kept"
            line = f"the inference node is inactive (lifecycle), {kept}: waiting for its activate transition ..."
        elif not d or inactive:  # just activated: its first full status is a second away
            line = "waiting for the inference node's diagnostics ..."
        elif robots:
            line = (f"{_ticks(d)}  {frame}  " + "  ".join(_robot_status(r, rd) for r, rd in robots.items())
                    + f"  | {partial}")
        else:
            line = (f"{_ticks(d)}  f=H/T {_num(d.get('action_frequency_hz'))} Hz  chunk age "
                    f"{_num(d.get('chunk_age_ms'))} ms  {frame}  "
                    f"{_num(d.get('tokens_per_s'))} tok/s  underruns {d.get('underruns', '?')}  "
                    f"| {partial}")
        if self.tty:
            self.out.write("\r" + line.ljust(self._status_len))
            self._status_len = len(line)
        elif line != self._last_line:  # a log: a wait is said once, not every second
            self.out.write(line + "\n")
        self._last_line = line
        self.out.flush()

    def end_status(self) -> None:
        if self.tty and self._status_len:
            self.out.write("\n")
            self.out.flush()
            self._status_len = 0


def status_text(robot: str | None, text: str, width: int = 40) -> str:
    """The end of a text being decoded, as the status line shows it: its last ``width``
    characters, after its robot's name (cutting the whole, name included, cut the name off)."""
    return ("" if robot is None else f"{robot}: ") + repr(text[-width:])


def _ticks(d: dict[str, str]) -> str:
    """The control tick's rate: what goes out (one action per tick), as the status line starts."""
    return f"ticks {_num(d.get('control_rate_hz'))} Hz"


def _robot_status(robot: str, d: dict[str, str]) -> str:
    """One robot's part of the status line (``f``: H x the robot's chunks per second)."""
    if not d:
        return f"[{robot} ?]"
    return (f"[{robot} f={_num(d.get('action_frequency_hz'))} age {_num(d.get('chunk_age_ms'))} "
            f"ur {d.get('underruns', '?')} {_num(d.get('tokens_per_s'))} tok/s]")


def _num(value, digits=0):
    try:
        v = float(value)
    except (TypeError, ValueError):
        return "?"
    return "?" if math.isnan(v) else f"{v:.{digits}f}"

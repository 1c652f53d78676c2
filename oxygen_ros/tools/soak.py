"""``oxygen-soak``: the default agent under bad input and camera gaps, for as long as asked.

Usage::

    oxygen-soak --duration SECONDS [--json PATH] [--gap-every S] [--gap-s S] [--inject-every S]
                [--settle S] [name:=value ...]

Runs the nodes of ``oxygen-agent demo:=true`` (synthetic closed-loop camera,
camera node, inference node at the YAML's 50 Hz; ``name:=value`` are the
agent's launch arguments) in one process, plus a second camera node on a
compressed topic of its own (so that corrupt JPEG/PNG data goes through a
camera node too), and a soak node that:

* injects, one every ``--inject-every`` seconds in a fixed cycle, bad images of
  every kind (raw: unsupported encoding, zero size, empty data, too large,
  bad step, size mismatch; compressed: empty, not JPEG/PNG, truncated/corrupt
  JPEG, PNG of zero size or past the byte limit), bad states (NaN, inf, empty,
  too long, names disagreeing with positions), bad instructions (empty, 10,000
  characters, control characters, invalid UTF-8; the scene's instruction is
  restored right after), bad questions (empty, blank, control characters
  only, 10,000 characters, invalid UTF-8) and bad Observations sent straight
  to the inference node (NaN / too long state, names disagreeing with images,
  a bad image); and a valid question every other injection;
* pauses the synthetic camera for ``--gap-s`` seconds every ``--gap-every``
  seconds (a camera drop-out);
* counts on the subscriber side every TextToken per request and checks it
  against the request's final index (tokens lost), and every question's end.

At the end (or on Ctrl-C / SIGTERM) the inference node is shut down (running
requests end ``cancelled``) and it prints, and with ``--json`` writes: control
ticks, underruns inside injected gaps (plus a recovery allowance of
``--gap-grace`` s) and outside them, frames, requests started / finished /
rejected / cancelled, tokens received and lost, questions sent and how each
ended, what was injected and how each node counted it, and the resident
memory (``VmRSS``) after start-up, at the end of the ``--settle`` period
(the baseline: allocators and caches fill during the first seconds) and at the
end, with the growth in percent over the baseline. Exit status 1 when a
token was lost, a request or question never ended, or (runs of at least 120
s) memory grew by 5 % or more.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

MEMORY_CHECK_MIN_S = 120.0
MAX_GROWTH_PCT = 5.0
COMPRESSED_TOPIC = "/oxygen_soak/compressed"
INVALID_UTF8 = b"\xff\xfe\xc3("  # a stray continuation byte, a truncated sequence


def rss_bytes() -> int:
    """Resident memory of this process (``VmRSS`` of /proc/self/status), 0 if unknown."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def with_invalid_utf8(msg, marker: str) -> bytes:
    """``msg`` serialized with the UTF-8 bytes of ``marker`` (4 ASCII characters, once in
    one of its strings) replaced by invalid UTF-8: what a publisher that does not
    check its text can put on the wire. Published as raw bytes."""
    from rclpy.serialization import serialize_message

    data = serialize_message(msg)
    key = marker.encode("ascii")
    assert len(key) == len(INVALID_UTF8) and data.count(key) == 1, marker
    return data.replace(key, INVALID_UTF8)


# --------------------------------------------------------------------------
# What is injected
# --------------------------------------------------------------------------


def _raw_image(encoding="rgb8", height=4, width=4, step=None, data=None, stamp=None):
    from sensor_msgs.msg import Image

    channels = {"rgb8": 3, "bgr8": 3, "mono8": 1}.get(encoding, 3)
    step = width * channels if step is None else step
    msg = Image(height=height, width=width, encoding=encoding, step=step)
    if stamp is not None:
        msg.header.stamp = stamp
    msg.data = bytes(height * step) if data is None else data
    return msg


def _compressed(data: bytes, stamp=None):
    from sensor_msgs.msg import CompressedImage

    msg = CompressedImage(format="jpeg")
    if stamp is not None:
        msg.header.stamp = stamp
    msg.data = data
    return msg


def _png_header(width: int, height: int) -> bytes:
    import struct
    import zlib

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))


class Soak:
    """The soak node: injects, pauses the camera, counts what comes out."""

    def __init__(self, node, inference, synthetic, cameras, topics: dict[str, str]):
        import numpy as np
        from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
        from sensor_msgs.msg import CompressedImage, Image, JointState
        from std_msgs.msg import String

        from oxygen_ros.msg import ActionChunk, Question, TextToken
        from oxygen_ros.msg import Observation as ObservationMsg
        from oxygen_ros.ros.camera_node import LATCHED_QOS
        from oxygen_ros.ros.conversions import rgb_to_compressed_msg

        self.node, self.inference, self.synthetic, self.cameras = node, inference, synthetic, cameras
        self.np = np
        reliable = lambda n: QoSProfile(depth=n, reliability=ReliabilityPolicy.RELIABLE)  # noqa: E731
        self.pub_image = node.create_publisher(Image, topics["image"], qos_profile_sensor_data)
        self.pub_compressed = node.create_publisher(CompressedImage, COMPRESSED_TOPIC, qos_profile_sensor_data)
        self.pub_state = node.create_publisher(JointState, topics["state"], qos_profile_sensor_data)
        self.pub_instruction = node.create_publisher(String, topics["instruction"], LATCHED_QOS)
        self.pub_question = node.create_publisher(Question, topics["question"], reliable(100))
        self.pub_observation = node.create_publisher(ObservationMsg, topics["observation"], reliable(10))
        self.lock = threading.Lock()
        # subscriber-side counts (bounded: only open requests are kept)
        self.open: dict[int, dict[str, Any]] = {}  # request id -> {tokens, next index, client}
        self.ends = Counter()  # finish reason -> requests (request id > 0)
        self.refused = Counter()  # finish reason -> messages with request id 0 (refused before a request)
        self.started = 0
        self.tokens_received = 0
        self.tokens_lost = 0
        self.index_gaps = 0
        self.questions_sent: dict[str, str] = {}  # client id -> kind, until it ends
        self.question_kinds_sent = Counter()
        self.question_ends = Counter()  # (kind, finish reason)
        self.actions_received = 0
        node.create_subscription(TextToken, topics["text"], self._on_text, reliable(10000))
        node.create_subscription(ActionChunk, topics["actions"], self._on_actions, reliable(100))
        self.injected = Counter()
        self._restore_at: float | None = None
        self._question_n = 0
        smooth = np.tile(np.arange(32, dtype=np.uint8)[:, None, None] * 7, (1, 32, 3))
        self._jpeg = bytes(rgb_to_compressed_msg(smooth, "jpeg").data)
        self.cycle: list[tuple[str, Callable[[], None]]] = self._cycle()
        self._next = 0

    # -- output side
    def _on_actions(self, msg) -> None:
        with self.lock:
            self.actions_received += 1

    def _on_text(self, msg) -> None:
        with self.lock:
            rid = int(msg.request_id)
            if rid == 0:  # refused before it became a request (bad text, no observation, shutdown)
                self.refused[msg.finish_reason] += 1
                self._question_end(msg.client_id, msg.finish_reason)
                return
            r = self.open.get(rid)
            if r is None:
                r = self.open[rid] = {"tokens": 0, "next": 0, "client": msg.client_id}
                self.started += 1
            if msg.index != r["next"]:
                self.index_gaps += 1
            r["next"] = msg.index + 1
            if msg.token_id >= 0:
                r["tokens"] += 1
                self.tokens_received += 1
            if msg.done:
                expected = msg.index + (1 if msg.token_id >= 0 else 0)
                self.tokens_lost += max(0, expected - r["tokens"])
                self.ends[msg.finish_reason] += 1
                self._question_end(msg.client_id, msg.finish_reason)
                del self.open[rid]

    def _question_end(self, client: str, reason: str) -> None:
        kind = self.questions_sent.pop(client, None)
        if kind is not None:
            self.question_ends[(kind, reason)] += 1

    # -- input side
    def _now(self):
        return self.node.get_clock().now().to_msg()

    def _ask(self, kind: str, text: str | None = None, raw: bytes | None = None) -> None:
        from oxygen_ros.msg import Question

        self._question_n += 1
        client = f"soak-{kind}-{self._question_n}"
        with self.lock:
            self.questions_sent[client] = kind
            self.question_kinds_sent[kind] += 1
        if raw is not None:
            self.pub_question.publish(with_invalid_utf8(Question(client_id=client, text="what is XUTF here?"),
                                                        "XUTF"))
        else:
            self.pub_question.publish(Question(client_id=client, text=text))

    def _instruction(self, text: str | None = None, invalid_utf8: bool = False) -> None:
        from std_msgs.msg import String

        if invalid_utf8:
            self.pub_instruction.publish(with_invalid_utf8(String(data="move to the XUTF square"), "XUTF"))
        else:
            self.pub_instruction.publish(String(data=text))
        self._restore_at = time.monotonic() + 0.5  # then the scene's instruction again

    def _state(self, position, names=None) -> None:
        from sensor_msgs.msg import JointState

        msg = JointState(name=list(names or []))
        msg.header.stamp = self._now()
        msg.position = [float(v) for v in position]
        self.pub_state.publish(msg)

    def _observation(self, change: Callable) -> None:
        import array

        from oxygen_ros.core.observation import Observation
        from oxygen_ros.ros.conversions import observation_to_msg

        image = self.np.zeros((32, 32, 3), self.np.uint8)
        msg = observation_to_msg(Observation({"base": image}, "soak", None), 0, stamp=self._now())
        change(msg, array)
        self.pub_observation.publish(msg)

    def _cycle(self) -> list[tuple[str, Callable[[], None]]]:
        np = self.np
        nan, inf = math.nan, math.inf
        image = lambda **kw: (lambda: self.pub_image.publish(_raw_image(stamp=self._now(), **kw)))  # noqa: E731
        compressed = lambda data: (lambda: self.pub_compressed.publish(_compressed(data, self._now())))  # noqa: E731

        def set_state(values):
            return lambda m, array: setattr(m, "state", array.array("f", values))

        def names_mismatch(m, array):
            m.camera_names = ["base", "wrist"]

        def bad_step(m, array):
            m.images[0].step = 5

        items = [
            ("image/unsupported_encoding", image(encoding="yuv422")),
            ("image/zero_size", image(height=0, data=b"")),
            ("image/empty_data", image(data=b"")),
            ("image/too_large", image(height=100_000, width=100_000, data=bytes(30))),
            ("image/bad_step", image(step=5)),
            ("image/size_mismatch", image(data=bytes(47))),
            ("compressed/empty_data", compressed(b"")),
            ("compressed/unsupported_format", compressed(b"GIF89a" + bytes(40))),
            ("compressed/corrupt_truncated", compressed(self._jpeg[:200])),
            ("compressed/corrupt_no_frame", compressed(b"\xff\xd8\xff\xe0\x00\x10" + bytes(100))),
            ("compressed/corrupt_scan", compressed(self._jpeg[:-40] + bytes(np.random.default_rng(0).integers(
                0, 256, 40, dtype=np.uint8)))),
            ("compressed/zero_size", compressed(_png_header(0, 8))),
            ("compressed/too_large", compressed(_png_header(100_000, 100_000))),
            ("state/nan", lambda: self._state([0.1, nan])),
            ("state/inf", lambda: self._state([inf, 0.0])),
            ("state/empty", lambda: self._state([])),
            ("state/too_long", lambda: self._state([0.0] * 40)),
            ("state/names_mismatch", lambda: self._state([0.1, 0.2], ["a", "b", "c"])),
            ("instruction/empty", lambda: self._instruction("")),
            ("instruction/huge", lambda: self._instruction(("move the gripper to the left edge " * 300)[:10_000])),
            ("instruction/control", lambda: self._instruction("move\x07 to\x1b the\tred\x00 square")),
            ("instruction/invalid_utf8", lambda: self._instruction(invalid_utf8=True)),
            ("question/empty", lambda: self._ask("empty", "")),
            ("question/blank", lambda: self._ask("blank", "  \t  ")),
            ("question/control_only", lambda: self._ask("control_only", "\x07\x1b\x01")),
            ("question/huge", lambda: self._ask("huge", ("where is the target and what next? " * 300)[:10_000])),
            ("question/control", lambda: self._ask("control", "where\x07 is\tthe target?")),
            ("question/invalid_utf8", lambda: self._ask("invalid_utf8", raw=b"")),
            ("observation/nan_state", lambda: self._observation(set_state([0.1, nan]))),
            ("observation/state_too_long", lambda: self._observation(set_state([0.0] * 40))),
            ("observation/names_mismatch", lambda: self._observation(names_mismatch)),
            ("observation/bad_image", lambda: self._observation(bad_step)),
        ]
        return items

    def inject(self) -> str:
        """The next bad message of the cycle; every other call also a valid question."""
        kind, send = self.cycle[self._next % len(self.cycle)]
        send()
        self.injected[kind] += 1
        if self._next % 2 == 0:
            self._ask("valid", "what should the robot do next?")
            self.injected["question/valid"] += 1
        self._next += 1
        return kind

    def poll(self) -> None:
        """Restore the scene's instruction after an injected one."""
        from std_msgs.msg import String

        if self._restore_at is not None and time.monotonic() >= self._restore_at:
            self._restore_at = None
            self.pub_instruction.publish(String(data=self.synthetic.sim.instruction))

    def counts(self) -> dict[str, Any]:
        with self.lock:
            questions = Counter()
            for (kind, reason), n in self.question_ends.items():
                questions[f"{kind}/{reason or 'open'}"] += n
            return {
                "requests_started": self.started,
                "requests_finished": self.ends["eos"] + self.ends["length"],
                "requests_rejected": self.ends["rejected"] + self.refused["rejected"],
                "requests_cancelled": self.ends["cancelled"] + self.refused["cancelled"],
                "requests_open": len(self.open),
                "refused_before_start": dict(self.refused),
                "tokens_received": self.tokens_received,
                "tokens_lost": self.tokens_lost,
                "index_gaps": self.index_gaps,
                "questions_sent": dict(self.question_kinds_sent),
                "questions_ended": dict(sorted(questions.items())),
                "questions_unanswered": len(self.questions_sent),
                "actions_received": self.actions_received,
            }


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------


def _parse(argv: list[str]) -> tuple[argparse.Namespace, dict[str, str]]:
    parser = argparse.ArgumentParser(prog="oxygen-soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("launch_args", nargs="*", metavar="name:=value",
                        help="oxygen-agent launch arguments (demo is always true)")
    parser.add_argument("--duration", type=float, required=True, help="seconds to run")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    parser.add_argument("--gap-every", type=float, default=30.0, help="seconds between camera gaps (default 30)")
    parser.add_argument("--gap-s", type=float, default=3.0, help="length of a camera gap in seconds (default 3)")
    parser.add_argument("--gap-grace", type=float, default=2.0,
                        help="seconds after a gap whose underruns still count as the gap's (default 2)")
    parser.add_argument("--inject-every", type=float, default=0.5,
                        help="seconds between two injected bad messages (default 0.5)")
    parser.add_argument("--settle", type=float, default=None,
                        help="seconds before the memory baseline is taken (default: min(30, duration / 10))")
    ns = parser.parse_args(argv)
    for name in ("duration", "gap_every", "gap_s", "inject_every"):
        if not getattr(ns, name) > 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0")
    values = {}
    for item in ns.launch_args:
        if ":=" not in item:
            parser.error(f"expected name:=value, got {item!r}")
        name, value = item.split(":=", 1)
        values[name.strip()] = value
    values["demo"] = "true"
    return ns, values


def _mb(n: int) -> float:
    return round(n / 2**20, 1)


def main(argv: list[str] | None = None) -> int:
    ns, values = _parse(sys.argv[1:] if argv is None else argv)
    from ..ros.agent import Spinner, build_nodes, resolve

    try:
        plan, params_file = resolve(values)
    except ValueError as exc:
        print(f"oxygen-soak: {exc}", file=sys.stderr)
        return 2

    import rclpy
    from rclpy.executors import ExternalShutdownException
    from rclpy.parameter import Parameter

    from ..ros.camera_node import CameraNode, ParameterError
    from ..ros.inference_node import init_control_process, settle_garbage_collector

    init_control_process([])
    nodes, spinner, soak, report, code = [], None, None, None, 0
    settle = ns.settle if ns.settle is not None else min(30.0, ns.duration / 10)
    t0 = time.monotonic()
    rss_launch, rss_start, rss_samples, windows, under_gap, under_out = rss_bytes(), None, [], [], 0, 0
    try:
        build_nodes(plan, params_file, nodes)
        by_name = {n.get_name(): n for n in nodes}
        inference, camera, synthetic = by_name["oxygen_inference"], by_name["oxygen_camera"], \
            by_name["oxygen_synthetic_camera"]
        compressed_camera = CameraNode(  # corrupt JPEG/PNG data goes through a camera node of its own
            cli_args=["--ros-args", "-r", "__node:=oxygen_soak_compressed_camera"],
            parameter_overrides=[Parameter("image_topics", value=[]),
                                 Parameter("compressed_image_topics", value=[COMPRESSED_TOPIC]),
                                 Parameter("observation_topic", value="/oxygen_soak/observation"),
                                 Parameter("image_size", value=32)])
        nodes.append(compressed_camera)
        p = inference.params
        topics = {"image": camera.topics[0], "state": camera.state_topic or "/joint_states",
                  "instruction": camera._instruction_topic, "question": p["question_topic"],
                  "observation": p["observation_topic"], "text": p["text_topic"], "actions": p["actions_topic"]}
        soak_node = rclpy.create_node("oxygen_soak")
        nodes.append(soak_node)
        soak = Soak(soak_node, inference, synthetic, [camera, compressed_camera], topics)
        settle_garbage_collector()
        spinner = Spinner("split", inference, soak_node, [n for n in nodes if n not in (inference, soak_node)])
        rss_launch = rss_bytes()
        print(f"oxygen-soak: {ns.duration:g} s of the demo agent ({p['setting']}, {p['control_rate_hz']:g} Hz, "
              f"H={inference.horizon}) with {len(soak.cycle)} kinds of bad input every {ns.inject_every:g} s and a "
              f"{ns.gap_s:g} s camera gap every {ns.gap_every:g} s; RSS {_mb(rss_launch)} MB", flush=True)

        t0 = time.monotonic()
        end = t0 + ns.duration
        next_inject, next_gap, gap_end = t0 + 1.0, t0 + ns.gap_every, None
        last_underruns = inference.tick_counts()["underruns"]
        next_sample, next_print = t0, t0 + 10.0
        while time.monotonic() < end:
            if not spinner.alive():
                raise RuntimeError("an executor stopped")
            now = time.monotonic()
            if gap_end is None and now >= next_gap and now + ns.gap_s < end:
                synthetic._timer.cancel()  # the camera drops out
                gap_end = now + ns.gap_s
                windows.append([now, gap_end])
            elif gap_end is not None and now >= gap_end:
                synthetic._timer.reset()
                gap_end, next_gap = None, now + ns.gap_every
            if now >= next_inject:
                soak.inject()
                next_inject += ns.inject_every
            soak.poll()
            underruns = inference.tick_counts()["underruns"]
            if underruns != last_underruns:
                in_gap = any(a <= now <= b + ns.gap_grace for a, b in windows[-2:])
                if in_gap:
                    under_gap += underruns - last_underruns
                else:
                    under_out += underruns - last_underruns
                last_underruns = underruns
            if now >= next_sample:
                rss = rss_bytes()
                if rss_start is None and now - t0 >= settle:
                    rss_start = rss
                rss_samples.append((round(now - t0, 1), rss))
                next_sample += 1.0
            if now >= next_print:
                c = soak.counts()
                print(f"  {now - t0:6.0f} s  ticks {inference.tick_counts()['ticks']}  underruns "
                      f"{under_gap} in gaps / {under_out} outside  frames {inference.counters['frames']}  requests "
                      f"{c['requests_started']}  tokens {c['tokens_received']} (lost {c['tokens_lost']})  RSS "
                      f"{_mb(rss_samples[-1][1])} MB", flush=True)
                next_print += 10.0
            time.sleep(0.02)
        if gap_end is not None:
            synthetic._timer.reset()
    except ParameterError as exc:
        print(f"oxygen-soak: {exc}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, ExternalShutdownException):
        print("oxygen-soak: interrupted: reporting what ran", flush=True)
    except Exception as exc:
        print(f"oxygen-soak: {exc!r}", file=sys.stderr)
        code = 1
    finally:
        try:
            if soak is not None:
                elapsed = time.monotonic() - t0
                rss_end = rss_bytes()
                ticks = inference.tick_counts()
                inference.shutdown()  # running requests end `cancelled`
                deadline = time.monotonic() + 3.0
                while soak.counts()["requests_open"] and time.monotonic() < deadline:
                    time.sleep(0.05)
                report = _report(ns, elapsed, inference, soak, ticks, under_gap, under_out, windows, rss_launch,
                                 rss_start, rss_end, rss_samples)
        except KeyboardInterrupt:
            pass
        if spinner is not None:
            spinner.shutdown()
        for node in reversed(nodes):
            node.destroy_node()
        rclpy.try_shutdown()
    if report is None:
        return code or 1
    _print(report)
    if ns.json is not None:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"oxygen-soak: report written to {ns.json}", flush=True)
    return code or (0 if all(report["checks"].values()) else 1)


def _report(ns, elapsed, inference, soak, ticks, under_gap, under_out, windows, rss_launch, rss_start, rss_end,
            samples) -> dict[str, Any]:
    c = soak.counts()
    n = inference.counters
    baseline = rss_start or rss_launch
    growth = (rss_end - baseline) / baseline * 100 if baseline else math.nan
    camera_rejected = {cam.get_name(): {k: v for k, v in cam.rejected.items() if v} for cam in soak.cameras}
    report = {
        "duration_s": round(elapsed, 1),
        "setting": inference.params["setting"],
        "control_rate_hz": inference.params["control_rate_hz"],
        "ticks": ticks["ticks"],
        "actions_published": n["actions_published"],
        "actions_received": c["actions_received"],
        "underruns": ticks["underruns"],
        "underruns_in_gaps": under_gap,
        "underruns_outside_gaps": under_out,
        "gaps": len(windows),
        "gap_s": ns.gap_s,
        "missed_ticks": n["missed_ticks"],
        "frames": n["frames"],
        "language_frames": n["language_frames"],
        "frame_errors": n["frame_errors"],
        "requests_started": c["requests_started"],
        "requests_finished": c["requests_finished"],
        "requests_rejected": c["requests_rejected"],
        "requests_cancelled": c["requests_cancelled"],
        "requests_open_at_end": c["requests_open"],
        "tokens_received": c["tokens_received"],
        "tokens_lost": c["tokens_lost"] + c["index_gaps"],
        "questions_sent": c["questions_sent"],
        "questions_ended": c["questions_ended"],
        "questions_unanswered": c["questions_unanswered"],
        "injected": dict(sorted(soak.injected.items())),
        "camera_rejected": camera_rejected,
        "inference_refused": {k: n[k] for k in ("observations_invalid", "observations_stale", "instructions_truncated",
                                                "questions_rejected_empty", "questions_truncated",
                                                "questions_rejected_no_observation", "actions_non_finite")},
        "hold_ticks": n["hold_ticks"],
        "k_last": inference.diagnostics()["k"],
        "rss_launch_mb": _mb(rss_launch),
        "rss_start_mb": _mb(baseline),
        "rss_end_mb": _mb(rss_end),
        "rss_max_mb": _mb(max([r for _, r in samples] + [rss_end])),
        "rss_growth_pct": round(growth, 2),
        "rss_samples_mb": [(t, _mb(r)) for t, r in samples[:: max(1, len(samples) // 60)]],
    }
    report["checks"] = {
        "no_token_lost": report["tokens_lost"] == 0,
        "every_request_ended": c["requests_open"] == 0,
        "every_question_ended": c["questions_unanswered"] == 0,
        "memory_flat": elapsed < MEMORY_CHECK_MIN_S or growth < MAX_GROWTH_PCT,
    }
    return report


def _print(r: dict[str, Any]) -> None:
    lines = [
        f"oxygen-soak: {r['duration_s']} s, setting {r['setting']}, {r['control_rate_hz']:g} Hz",
        f"  ticks                {r['ticks']} ({r['actions_published']} ActionChunks published, "
        f"{r['actions_received']} received; {r['missed_ticks']} missed by the timer)",
        f"  underruns            {r['underruns']}: {r['underruns_in_gaps']} in {r['gaps']} injected camera gaps of "
        f"{r['gap_s']:g} s, {r['underruns_outside_gaps']} outside",
        f"  frames               {r['frames']} observation frames, {r['language_frames']} language-only, "
        f"{r['frame_errors']} errors",
        f"  requests             started {r['requests_started']}, finished {r['requests_finished']}, rejected "
        f"{r['requests_rejected']}, cancelled {r['requests_cancelled']}, still open {r['requests_open_at_end']}",
        f"  tokens               received {r['tokens_received']}, lost {r['tokens_lost']}",
        f"  questions            sent {sum(r['questions_sent'].values())}, never ended {r['questions_unanswered']}: "
        f"{r['questions_ended']}",
        f"  injected             {sum(r['injected'].values())} messages of {len(r['injected'])} kinds",
        f"  rejected by cameras  {r['camera_rejected']}",
        f"  refused by inference {r['inference_refused']}",
        f"  memory (RSS)         launch {r['rss_launch_mb']} MB, start {r['rss_start_mb']} MB, end "
        f"{r['rss_end_mb']} MB ({r['rss_growth_pct']:+.2f} %), max {r['rss_max_mb']} MB",
        f"  checks               {r['checks']}",
    ]
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    sys.exit(main())

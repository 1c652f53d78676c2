"""The soak node of ``oxygen-soak``: injects bad input of every kind, counts what comes out.

:class:`Soak` publishes, one per :meth:`Soak.inject` in a fixed cycle, bad
images (raw and compressed), states, instructions, questions and Observations
(the module doc of :mod:`.soak` lists them), and a valid question every other
call; on the subscriber side it counts every TextToken per request against the
request's final index (tokens lost) and how every question ended.
"""

from __future__ import annotations

import array
import math
import struct
import threading
import time
import zlib
from collections import Counter, deque
from typing import Any, Callable

import numpy as np
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from rclpy.serialization import serialize_message
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import String

from oxygen_ros.msg import ActionChunk, Question, TextToken
from oxygen_ros.msg import Observation as ObservationMsg

from ..core.observation import Observation
from ..ros.qos import LATCHED_QOS
from ..ros.conversions import observation_to_msg, rgb_to_compressed_msg
from .token_tally import TokenTally

COMPRESSED_TOPIC = "/oxygen_soak/compressed"
#: The injected kind that is no bad input: a valid question every other injection.
VALID_QUESTION = "question/valid"
INVALID_UTF8 = b"\xff\xfe\xc3("  # a stray continuation byte, a truncated sequence


def with_invalid_utf8(msg, marker: str) -> bytes:
    """``msg`` serialized with the UTF-8 bytes of ``marker`` (4 ASCII characters, once in
    one of its strings) replaced by invalid UTF-8: what a publisher that does not
    check its text can put on the wire. Published as raw bytes."""
    data = serialize_message(msg)
    key = marker.encode("ascii")
    assert len(key) == len(INVALID_UTF8) and data.count(key) == 1, marker
    return data.replace(key, INVALID_UTF8)


# --------------------------------------------------------------------------
# What is injected
# --------------------------------------------------------------------------


def _raw_image(encoding="rgb8", height=4, width=4, step=None, data=None, stamp=None):
    channels = {"rgb8": 3, "bgr8": 3, "mono8": 1}.get(encoding, 3)
    step = width * channels if step is None else step
    msg = Image(height=height, width=width, encoding=encoding, step=step)
    if stamp is not None:
        msg.header.stamp = stamp
    msg.data = bytes(height * step) if data is None else data
    return msg


def _compressed(data: bytes, stamp=None):
    msg = CompressedImage(format="jpeg")
    if stamp is not None:
        msg.header.stamp = stamp
    msg.data = data
    return msg


def _png_header(width: int, height: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))


# Changes that make a valid Observation message bad (``change`` of Soak._observation)
def _set_state(values):
    return lambda m: setattr(m, "state", array.array("f", values))


def _names_mismatch(m):
    m.camera_names = ["base", "wrist"]


def _bad_step(m):
    m.images[0].step = 5


class Soak:
    """The soak node: injects bad input, counts what comes out (the camera gaps are
    :class:`.soak.SoakSession`'s, the instruction after an injected one the scene's again)."""

    def __init__(self, node, inference, synthetic, cameras, topics: dict[str, str]):
        self.node, self.inference, self.synthetic, self.cameras = node, inference, synthetic, cameras
        reliable = lambda n: QoSProfile(depth=n, reliability=ReliabilityPolicy.RELIABLE)  # noqa: E731
        self.pub_image = node.create_publisher(Image, topics["image"], qos_profile_sensor_data)
        self.pub_compressed = node.create_publisher(CompressedImage, COMPRESSED_TOPIC, qos_profile_sensor_data)
        self.pub_state = node.create_publisher(JointState, topics["state"], qos_profile_sensor_data)
        self.pub_instruction = node.create_publisher(String, topics["instruction"], LATCHED_QOS)
        self.pub_question = node.create_publisher(Question, topics["question"], reliable(100))
        self.pub_observation = node.create_publisher(ObservationMsg, topics["observation"], reliable(10))
        self.lock = threading.Lock()
        # subscriber-side counts (bounded: only open requests are kept)
        self.tally = TokenTally()  # started requests (request id > 0)
        self.refused = Counter()  # finish reason -> messages with request id 0 (refused before a request)
        self.questions_sent: dict[str, str] = {}  # client id -> kind, until it ends
        self.question_kinds_sent = Counter()
        self.question_ends = Counter()  # (kind, finish reason)
        self.actions_received = 0
        node.create_subscription(TextToken, topics["text"], self._on_text, reliable(10000))
        node.create_subscription(ActionChunk, topics["actions"], self._on_actions, reliable(100))
        # stamps of the synthetic camera's recent frames (the soak's own bad images have no frame id)
        self.camera_stamps: deque = deque(maxlen=100)
        node.create_subscription(Image, topics["image"], self._on_image, qos_profile_sensor_data)
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

    def _on_image(self, msg) -> None:
        if msg.header.frame_id == self.synthetic.frame_id:
            with self.lock:
                self.camera_stamps.append(msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec)

    def first_camera_frame(self, after_ns: int) -> int | None:
        """The stamp of the synthetic camera's first frame stamped at or after ``after_ns`` (ROS clock)."""
        with self.lock:
            return next((s for s in self.camera_stamps if s >= after_ns), None)

    def _on_text(self, msg) -> None:
        with self.lock:
            rid = int(msg.request_id)
            if rid == 0:  # refused before it became a request (bad text, no observation, shutdown)
                self.refused[msg.finish_reason] += 1
                self._question_end(msg.client_id, msg.finish_reason)
                return
            if self.tally.add(rid, int(msg.index), int(msg.token_id), bool(msg.done), msg.finish_reason):
                self._question_end(msg.client_id, msg.finish_reason)

    def _question_end(self, client: str, reason: str) -> None:
        kind = self.questions_sent.pop(client, None)
        if kind is not None:
            self.question_ends[(kind, reason)] += 1

    # -- input side
    def _now(self):
        return self.node.get_clock().now().to_msg()

    def _ask(self, kind: str, text: str | None = None, raw: bytes | None = None) -> None:
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
        if invalid_utf8:
            self.pub_instruction.publish(with_invalid_utf8(String(data="move to the XUTF square"), "XUTF"))
        else:
            self.pub_instruction.publish(String(data=text))
        self._restore_at = time.monotonic() + 0.5  # then the scene's instruction again

    def _state(self, position, names=None) -> None:
        msg = JointState(name=list(names or []))
        msg.header.stamp = self._now()
        msg.position = [float(v) for v in position]
        self.pub_state.publish(msg)

    def _observation(self, change: Callable) -> None:
        image = np.zeros((32, 32, 3), np.uint8)
        msg = observation_to_msg(Observation({"base": image}, "soak", None), 0, stamp=self._now())
        change(msg)
        self.pub_observation.publish(msg)

    def _cycle(self) -> list[tuple[str, Callable[[], None]]]:
        nan, inf = math.nan, math.inf
        image = lambda **kw: (lambda: self.pub_image.publish(_raw_image(stamp=self._now(), **kw)))  # noqa: E731
        compressed = lambda data: (lambda: self.pub_compressed.publish(_compressed(data, self._now())))  # noqa: E731
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
            ("observation/nan_state", lambda: self._observation(_set_state([0.1, nan]))),
            ("observation/state_too_long", lambda: self._observation(_set_state([0.0] * 40))),
            ("observation/names_mismatch", lambda: self._observation(_names_mismatch)),
            ("observation/bad_image", lambda: self._observation(_bad_step)),
        ]
        return items

    def inject(self) -> str:
        """The next bad message of the cycle; every other call also a valid question."""
        kind, send = self.cycle[self._next % len(self.cycle)]
        send()
        self.injected[kind] += 1
        if self._next % 2 == 0:
            self._ask("valid", "what should the robot do next?")
            self.injected[VALID_QUESTION] += 1
        self._next += 1
        return kind

    def poll(self) -> None:
        """Restore the scene's instruction after an injected one."""
        if self._restore_at is not None and time.monotonic() >= self._restore_at:
            self._restore_at = None
            self.pub_instruction.publish(String(data=self.synthetic.sim.instruction))

    def counts(self) -> dict[str, Any]:
        with self.lock:
            questions = Counter()
            for (kind, reason), n in self.question_ends.items():
                questions[f"{kind}/{reason or 'open'}"] += n
            t = self.tally
            return {
                "requests_started": t.started,
                "requests_finished": t.ends["eos"] + t.ends["length"],
                "requests_rejected": t.ends["rejected"] + self.refused["rejected"],
                "requests_cancelled": t.ends["cancelled"] + self.refused["cancelled"],
                "requests_open": len(t.open),
                "refused_before_start": dict(self.refused),
                "tokens_received": t.tokens_received,
                "tokens_lost": t.tokens_lost,
                "index_gaps": t.index_gaps,
                "questions_sent": dict(self.question_kinds_sent),
                "questions_ended": dict(sorted(questions.items())),
                "questions_unanswered": len(self.questions_sent),
                "actions_received": self.actions_received,
            }

"""Reliability, issue 6 items 1-2: whatever arrives on the input topics, the nodes keep
running, say what was wrong and never feed bad data to the model.

Real nodes on real DDS (private contexts, topics of their own); counts and message
contents are checked, never durations.
"""

import array
import functools
import json
import math
import time

import numpy as np
import pytest
import ros_harness
from ros_harness import (
    Ros,
    inference_topics,
    observation_msg,
    reliable,
    ros_environment,
    unique_prefix,
)

from oxygen_ros.ros.conversions import IMAGE_ERROR_REASONS


@pytest.fixture
def ros(monkeypatch, tmp_path):
    ros_environment(monkeypatch, tmp_path)
    with Ros() as r:
        yield r


until = functools.partial(ros_harness.until, timeout=20.0)  # best-effort topics: publish meanwhile


def _params(**values):
    from rclpy.parameter import Parameter

    return [Parameter(k, value=v) for k, v in values.items()]


def _cdr_with(msg, marker: bytes, replacement: bytes) -> bytes:
    """``msg`` serialized, with the bytes of one string replaced (same length): how a
    publisher that does not check its text (C++, a bridge) can put invalid UTF-8 on the wire."""
    from rclpy.serialization import serialize_message

    data = serialize_message(msg)
    assert data.count(marker) == 1 and len(marker) == len(replacement)
    return data.replace(marker, replacement)


INVALID_UTF8 = b"\xff\xfe\xc3("  # a stray continuation byte, a truncated sequence


# --------------------------------------------------------------------------
# camera node
# --------------------------------------------------------------------------


class CameraRig:
    """A camera node on its own topics and a test node feeding it and recording its outputs
    (observations, /diagnostics of this camera node, its /rosout lines)."""

    def __init__(self, ros, **params):
        from diagnostic_msgs.msg import DiagnosticArray
        from oxygen_ros.msg import Observation
        from rcl_interfaces.msg import Log
        from rclpy.qos import (
            DurabilityPolicy,
            QoSProfile,
            ReliabilityPolicy,
            qos_profile_sensor_data,
        )
        from sensor_msgs.msg import CompressedImage, Image, JointState
        from std_msgs.msg import String

        from oxygen_ros.ros.camera_node import CameraNode
        from oxygen_ros.ros.qos import LATCHED_QOS, OBSERVATION_QOS

        p = self.prefix = unique_prefix()
        self.ros = ros
        defaults = dict(image_topics=[f"{p}/raw"], compressed_image_topics=[f"{p}/jpeg"],
                        instruction_topic=f"{p}/instruction", observation_topic=f"{p}/observation",
                        state_topic=f"{p}/joint_states", image_size=16, max_age=5.0, max_image_bytes=10_000,
                        default_instruction="fallback")
        defaults.update(params)
        self.node = ros.node("oxygen_test_camera_rig")
        self.observations, self.diagnostics, self.logs = [], [], []
        self.node.create_subscription(Observation, f"{p}/observation", self.observations.append, OBSERVATION_QOS)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, reliable(50))
        self.node.create_subscription(Log, "/rosout", self._on_log, QoSProfile(
            depth=1000, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL))
        self.raw = self.node.create_publisher(Image, f"{p}/raw", qos_profile_sensor_data)
        self.jpeg = self.node.create_publisher(CompressedImage, f"{p}/jpeg", qos_profile_sensor_data)
        self.state = self.node.create_publisher(JointState, f"{p}/joint_states", qos_profile_sensor_data)
        self.instruction = self.node.create_publisher(String, f"{p}/instruction", LATCHED_QOS)
        self.camera = ros.add(CameraNode(context=ros.context, parameter_overrides=_params(**defaults)))
        assert until(lambda: all(pub.get_subscription_count() >= 1 for pub in (self.raw, self.jpeg, self.state,
                                                                                self.instruction)))

    def _on_diag(self, msg):
        for status in msg.status:
            if status.name.startswith("oxygen_camera") and self.prefix in status.hardware_id:
                self.diagnostics.append(status)

    def _on_log(self, msg):
        if self.prefix in msg.msg:
            self.logs.append(msg)

    def now(self):
        from oxygen_ros.ros.conversions import ns_to_time_msg

        return ns_to_time_msg(self.node.get_clock().now().nanoseconds)

    def send_good(self, state=(0.25, -0.5)):
        from sensor_msgs.msg import JointState

        from oxygen_ros.ros.conversions import rgb_to_compressed_msg, rgb_to_image_msg

        rgb = np.full((8, 8, 3), 77, np.uint8)
        self.state.publish(JointState(name=["a", "b"][:len(state)], position=list(state)))
        self.raw.publish(rgb_to_image_msg(rgb, "bgr8", self.now()))
        self.jpeg.publish(rgb_to_compressed_msg(rgb, "png", self.now()))


def _raw(encoding="rgb8", height=4, width=4, step=None, data=None):
    from sensor_msgs.msg import Image

    channels = {"rgb8": 3, "bgr8": 3, "mono8": 1}.get(encoding, 3)
    step = width * channels if step is None else step
    msg = Image(height=height, width=width, encoding=encoding, step=step)
    msg.data = bytes(height * step) if data is None else data
    return msg


def _compressed(data):
    from sensor_msgs.msg import CompressedImage

    msg = CompressedImage(format="jpeg")
    msg.data = data
    return msg


def _png_with_size(width, height):
    import struct
    import zlib

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr
            + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr)))


def _bad_images():
    """(publisher attribute, message, reason): every way an image can be refused."""
    from oxygen_ros.ros.conversions import rgb_to_compressed_msg, rgb_to_image_msg

    smooth = np.tile(np.arange(32, dtype=np.uint8)[:, None, None] * 7, (1, 32, 3))
    jpeg = bytes(rgb_to_compressed_msg(smooth, "jpeg").data)
    return [
        ("raw", _raw("yuv422"), "unsupported_encoding"),
        ("raw", _raw("32FC1"), "unsupported_encoding"),
        ("raw", _raw(height=0, data=b""), "zero_size"),
        ("raw", _raw(data=b""), "empty_data"),
        ("raw", _raw(height=100_000, width=100_000, data=bytes(30)), "too_large"),  # claims to be huge
        ("raw", rgb_to_image_msg(np.zeros((64, 64, 3), np.uint8)), "too_large"),  # 12288 B > max_image_bytes
        ("raw", _raw(step=5), "bad_step"),
        ("raw", _raw(data=bytes(47)), "size_mismatch"),
        ("jpeg", _compressed(b""), "empty_data"),
        ("jpeg", _compressed(b"GIF89a" + bytes(40)), "unsupported_format"),
        ("jpeg", _compressed(jpeg[:200]), "corrupt_compressed"),  # header fine, scan cut short
        ("jpeg", _compressed(b"\xff\xd8\xff\xe0\x00\x10" + bytes(100)), "corrupt_compressed"),
        ("jpeg", _compressed(_png_with_size(0, 8)), "zero_size"),
        ("jpeg", _compressed(_png_with_size(5000, 5000)), "too_large"),  # refused before decoding
    ]


def test_camera_node_rejects_every_bad_image_logs_counts_and_uses_the_next_good_frame(ros):
    rig = CameraRig(ros)
    camera = rig.camera
    assert until(rig.observations.__len__, every=rig.send_good), "no observation from good frames"

    cases = _bad_images()
    expected = {}
    for attr, msg, reason in cases:
        expected[reason] = expected.get(reason, 0) + 1
        before = camera.rejected[reason]
        pub = getattr(rig, attr)
        assert until(lambda: camera.rejected[reason] > before, every=lambda: pub.publish(msg)), reason
    assert {r for r, n in camera.rejected.items() if n} == set(expected)
    assert set(expected) >= set(IMAGE_ERROR_REASONS) - {"conversion_failed"}  # every reachable reason

    # the node keeps going: a bad frame in between good ones does not stop the stream
    count = len(rig.observations)
    for _ in range(5):
        rig.raw.publish(_raw("yuv422"))
        rig.send_good()
        time.sleep(0.02)
    assert until(lambda: len(rig.observations) > count, every=rig.send_good)
    img = rig.observations[-1].images[0]
    assert np.frombuffer(img.data, np.uint8).reshape(16, 16, 3)[8, 8].tolist() == [77, 77, 77]

    # one throttled log line per topic and reason, naming both; a burst is not logged line by line
    burst_before = camera.rejected["unsupported_encoding"]
    assert until(lambda: camera.rejected["unsupported_encoding"] >= burst_before + 20,
                 every=lambda: rig.raw.publish(_raw("yuv422")), period=0.01)
    raw_topic, jpeg_topic = camera.topics
    assert until(lambda: all(any(t in m.msg and r.replace("_", " ") in m.msg for m in rig.logs)
                             for a, _, r in cases for t in [raw_topic if a == "raw" else jpeg_topic]))
    yuv_lines = [m for m in rig.logs if raw_topic in m.msg and "unsupported encoding" in m.msg]
    assert len(yuv_lines) < camera.rejected["unsupported_encoding"] / 2, (len(yuv_lines), camera.rejected)

    # /diagnostics once a second: every counter, WARN while images are rejected
    def last_diagnostics():
        return {kv.key: kv.value for kv in rig.diagnostics[-1].values} if rig.diagnostics else {}

    assert until(lambda: all(last_diagnostics().get(f"rejected_{reason}") == str(count)
                             for reason, count in dict(camera.rejected).items()), timeout=15.0)
    last = last_diagnostics()
    assert int(last["rejected_total"]) >= sum(expected.values())
    assert int(last["base.frames"]) >= 1 and int(last["published"]) >= 1
    warned = [s for s in rig.diagnostics if s.level == b"\x01" and "rejected:" in s.message]
    assert warned and any("unsupported_encoding" in s.message for s in warned)
    # once nothing bad arrives any more, the status goes back to OK
    assert until(lambda: rig.diagnostics and rig.diagnostics[-1].level == b"\x00", timeout=10.0,
                 every=rig.send_good, period=0.1)


def test_camera_node_rejects_bad_states_and_handles_bad_instructions(ros):
    from sensor_msgs.msg import JointState
    from std_msgs.msg import String

    from oxygen_ros.ros.conversions import rgb_to_compressed_msg, rgb_to_image_msg

    rig = CameraRig(ros)
    camera = rig.camera
    rgb = np.full((8, 8, 3), 9, np.uint8)

    def images():
        rig.raw.publish(rgb_to_image_msg(rgb, "rgb8", rig.now()))
        rig.jpeg.publish(rgb_to_compressed_msg(rgb, "png", rig.now()))

    bad_states = [
        (JointState(name=["a", "b"], position=[0.1, math.nan]), "state_not_finite"),
        (JointState(name=["a", "b"], position=[math.inf, 0.0]), "state_not_finite"),
        (JointState(name=["a"], position=[]), "state_empty"),
        (JointState(position=[0.0] * 40), "state_too_long"),
        (JointState(name=["a", "b", "c"], position=[0.1, 0.2]), "state_names_mismatch"),
    ]
    for msg, reason in bad_states:
        before = camera.rejected[reason]

        def send(msg=msg):
            rig.state.publish(msg)
            images()

        assert until(lambda: camera.rejected[reason] > before, every=send), reason
        assert camera.state is None  # never forwarded, an older state is not reused either
    assert rig.observations == [], "an observation without a valid state was published"

    # instructions: empty -> default_instruction; control characters removed; invalid UTF-8
    # replaced (never a crash); a very long one is forwarded whole (the inference node cuts it)
    rig.instruction.publish(String(data="go\x07 left\n"))
    assert until(lambda: camera.instruction == "go left ")
    rig.instruction.publish(String(data=""))
    assert until(lambda: camera.instruction is None)
    rig.instruction.publish(_cdr_with(String(data="pick ABCD cube"), b"ABCD", INVALID_UTF8))
    assert until(lambda: camera.instruction is not None and camera.instruction.startswith("pick "))
    assert "\ufffd" in camera.instruction and camera.instruction.endswith(" cube")
    long_text = "put the red cube on the blue plate " * 300  # 10,500 characters
    rig.instruction.publish(String(data=long_text))
    assert until(lambda: camera.instruction == long_text)
    assert until(lambda: rig.observations and rig.observations[-1].instruction == long_text,
                 every=rig.send_good)
    assert list(rig.observations[-1].state) == [0.25, -0.5]
    rig.instruction.publish(String(data="   "))
    assert until(lambda: rig.observations and rig.observations[-1].instruction == "fallback",
                 every=rig.send_good)
    assert any("empty instruction" in m.msg for m in rig.logs)


# --------------------------------------------------------------------------
# inference node
# --------------------------------------------------------------------------


def _inference(ros, prefix, **params):
    from oxygen_ros.ros.inference_node import InferenceNode

    values = {**inference_topics(prefix), "preset": "tiny", "model_path": "", "frame_deadline_ms": 5000.0, **params}
    return ros.add(InferenceNode(context=ros.context, parameter_overrides=_params(**values)))


class Client:
    def __init__(self, ros, prefix):
        from oxygen_ros.msg import ActionChunk, Observation, Question, TextToken

        t = inference_topics(prefix)
        self.node = ros.node("oxygen_test_reliability_client")
        self.chunks, self.text = [], []
        self.node.create_subscription(ActionChunk, t["actions_topic"], self.chunks.append, reliable(100))
        self.node.create_subscription(TextToken, t["text_topic"], self.text.append, reliable(5000))
        self.obs = self.node.create_publisher(Observation, t["observation_topic"], reliable(10))
        self.q = self.node.create_publisher(Question, t["question_topic"], reliable(100))
        self.Question = Question
        assert until(lambda: self.obs.get_subscription_count() >= 1 and self.q.get_subscription_count() >= 1)
        self.seq = 0

    def now(self):
        return self.node.get_clock().now().nanoseconds

    def observe(self, **kw):
        self.obs.publish(observation_msg(self.seq, self.now(), **kw))
        self.seq += 1

    def ask(self, client, text):
        self.q.publish(self.Question(client_id=client, text=text))

    def finished(self, client):
        return [m for m in self.text if m.client_id == client and m.done]


def _record_engine_inputs(node):
    """Wrap Engine.step: every observation and question the model is given."""
    seen = []
    step = node.engine.step

    def recording(observations=(), questions=(), **kw):
        seen.extend(observations)
        seen.extend(questions)
        return step(observations, questions, **kw)

    node.engine.step = recording
    return seen


def test_inference_node_refuses_bad_observations_and_cuts_long_instructions(ros, tmp_path):
    from oxygen_ros.core.tokenizer import prompt_ids
    from oxygen_ros.ros.conversions import ns_to_time_msg

    stats = {"norm_stats": {"state": {"mean": [0, 0], "std": [1, 1], "q01": [-1, -1], "q99": [1, 1]},
                            "actions": {"mean": [0] * 4, "std": [1] * 4, "q01": [-1] * 4, "q99": [1] * 4}}}
    (tmp_path / "norm_stats.json").write_text(json.dumps(stats))
    prefix = unique_prefix()
    node = _inference(ros, prefix, norm_stats_path=str(tmp_path / "norm_stats.json"), chunk_origin="frame_end",
                      language_every_n_frames=0)
    seen = _record_engine_inputs(node)
    client = Client(ros, prefix)
    client.observe()
    assert until(lambda: node.counters["frames"] >= 1)

    def with_state(values):
        m = observation_msg(client.seq, client.now())
        m.state = array.array("f", values)
        return m

    def names_mismatch():
        m = observation_msg(client.seq, client.now())
        m.camera_names = ["base", "wrist"]
        return m

    def bad_image():
        m = observation_msg(client.seq, client.now())
        m.images[0].step = 5
        return m

    bad = [with_state([0.1, math.nan]), with_state([math.inf, 0.0]), names_mismatch(), bad_image(),
           with_state([0.0] * 40),  # more than MAX_STATE_DIM
           with_state([0.1, 0.2, 0.3])]  # wider than the checkpoint's state statistics
    for msg in bad:
        before = node.counters["observations_invalid"]
        msg.header.stamp = ns_to_time_msg(client.now())
        client.obs.publish(msg)
        assert until(lambda: node.counters["observations_invalid"] > before)
    frames = node.counters["frames"]
    long_instruction = "please pick up the small red cube next to the plate " * 200  # 10,600 characters
    client.observe(instruction=long_instruction)
    assert until(lambda: node.counters["frames"] > frames)
    client.observe(instruction="ok\x07 then")
    assert until(lambda: node.counters["frames"] > frames + 1)
    assert node.counters["observations_invalid"] == len(bad)
    assert node.counters["instructions_truncated"] == 1

    observations = [o for o in seen if hasattr(o, "images")]
    assert observations and all(o.state is None or (np.all(np.isfinite(o.state)) and o.state.shape[0] <= 2)
                                for o in observations), "a bad state reached the model"
    cut = [o for o in observations if o.instruction.startswith("please pick")]
    assert len(cut) == 1 and 0 < len(cut[0].instruction) < len(long_instruction)
    max_len = node.loaded.config.max_token_len
    assert len(prompt_ids(node.engine.tokenizer, cut[0].instruction, cut[0].state)) <= max_len
    assert observations[-1].instruction == "ok then"
    assert node.diagnostics()["observations_invalid"] == len(bad)


def test_inference_node_questions_empty_huge_control_and_invalid_utf8(ros):
    prefix = unique_prefix()
    node = _inference(ros, prefix, language_every_n_frames=0, max_decode=8, steps_per_frame=4)
    seen = _record_engine_inputs(node)
    client = Client(ros, prefix)
    for _ in range(3):
        client.observe()
    assert until(lambda: node.counters["frames"] >= 1)

    for name, text in [("empty", ""), ("blank", "   \t "), ("control", "\x07\x1b\x01")]:
        client.ask(name, text)
    client.ask("huge", "what is on the table and where should it go? " * 230)  # 10,350 characters
    client.ask("bell", "what\x07 do you\tsee?")
    client.q.publish(_cdr_with(client.Question(client_id="utf8", text="is ABCD there?"), b"ABCD", INVALID_UTF8))
    clients = ["empty", "blank", "control", "huge", "bell", "utf8"]

    def all_done():
        client.observe()
        return all(client.finished(c) for c in clients)

    assert until(all_done, timeout=30.0, period=0.1), {c: client.finished(c) for c in clients}
    for c in ("empty", "blank", "control"):
        (m,) = client.finished(c)
        assert m.finish_reason == "rejected" and m.token_id == -1
    for c in ("huge", "bell", "utf8"):
        (m,) = client.finished(c)
        assert m.finish_reason in ("eos", "length"), (c, m.finish_reason)
        tokens = [t for t in client.text if t.client_id == c]
        assert [t.index for t in tokens] == list(range(len(tokens))), "a token was lost"
    assert node.counters["questions_rejected_empty"] == 3
    assert node.counters["questions_truncated"] == 1
    questions = {q.client_id: q for q in seen if hasattr(q, "client_id") and not hasattr(q, "images")}
    assert set(questions) == {"huge", "bell", "utf8"}
    assert questions["bell"].text == "what do you see?"
    assert "\ufffd" in questions["utf8"].text
    assert len(questions["huge"].text) <= node.engine.config.max_question_tokens * 100


def test_engine_takes_a_10000_character_instruction_and_question():
    """The engine path itself: an over-long prompt is cut with a warning, an over-long
    question to max_question_tokens; the frame and the request run normally."""
    from oxygen_ros.core.engine import Engine, EngineConfig, Question
    from oxygen_ros.core.model.config import TINY
    from oxygen_ros.core.model.vla import build_model
    from oxygen_ros.core.observation import Observation
    from oxygen_ros.core.tokenizer import Tokenizer

    engine = Engine(build_model(TINY, seed=0), Tokenizer.default(), EngineConfig(max_decode=4, steps_per_frame=4))
    image = np.zeros((16, 16, 3), np.uint8)
    instruction = ("stack the cubes " * 700)[:10_000]
    with pytest.warns(UserWarning, match="truncating"):
        result = engine.step([Observation({"base": image}, instruction, np.array([0.1, 0.2], np.float32))],
                             [Question(("why " * 2500)[:10_000], client_id="q")])
    assert np.all(np.isfinite(result.actions[0]))
    assert len(result.started) == 2
    finished = result.finished + engine.drain()
    question = [r for r in finished if r.client_id == "q"]
    assert len(question) == 1 and question[0].finish_reason.value in ("eos", "length")
    assert len(question[0].question_ids) == engine.config.max_question_tokens

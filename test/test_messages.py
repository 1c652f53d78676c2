"""The generated messages (msg/*.msg): fields, defaults, documentation, serialization
round trips and one ActionChunk over real DDS.

They need the package built and installed (`make venv`), and run under `make test`,
which uses .venv/bin/python. rclpy is imported inside the tests only, so collecting
this file never starts ROS.
"""

import array
import math
import os
import random
import struct
import time
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ros_harness import REPO


def _msgs():
    from oxygen_ros.msg import ActionChunk, Observation, Question, TextToken

    return ActionChunk, TextToken, Observation, Question


ActionChunk, TextToken, Observation, Question = _msgs()


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def _as_float32(x):
    """x rounded to the nearest float32, as a float32 message field holds it."""
    return struct.unpack("f", struct.pack("f", x))[0]


def _stamp(sec, nanosec):
    from builtin_interfaces.msg import Time

    return Time(sec=sec, nanosec=nanosec)


def _header(frame_id="base_link", sec=1_700_000_000, nanosec=123_456_789):
    from std_msgs.msg import Header

    return Header(stamp=_stamp(sec, nanosec), frame_id=frame_id)


def _image(width=4, height=3, seed=0):
    from sensor_msgs.msg import Image

    rng = random.Random(seed)
    data = bytes(rng.randrange(256) for _ in range(width * height * 3))
    return Image(
        header=_header("cam"),
        height=height,
        width=width,
        encoding="rgb8",
        is_bigendian=0,
        step=width * 3,
        data=data,
    )


def _sample_action_chunk():
    horizon, dim = 5, 7
    return ActionChunk(
        header=_header(),
        frame_id=2**40 + 3,
        observation_seq=41,
        observation_stamp=_stamp(1_700_000_000, 5),
        offset=2,
        control_period=_as_float32(0.02),
        horizon=horizon,
        action_dim=dim,
        actions=[0.25 * i - 3.0 for i in range(horizon * dim)],
    )


def _sample_text_token():
    return TextToken(
        header=_header(),
        request_id=17,
        client_id="client-7",
        frame_id=99,
        observation_seq=41,
        observation_stamp=_stamp(1_700_000_000, 250_000_000),
        index=3,
        token_id=-1,
        piece=" grüße ✓",
        done=True,
        finish_reason=TextToken.FINISH_REJECTED,
        reason="no observation has arrived yet ✓",
    )


def _sample_observation():
    return Observation(
        header=_header(),
        seq=12345,
        instruction="pick up the red block",
        camera_names=["front", "wrist"],
        images=[_image(seed=1), _image(seed=2)],
        state=[_as_float32(v) for v in (0.1, -0.2, 0.3, 1.0)],
    )


def _sample_question():
    return Question(header=_header(), client_id="cli-1", text="What is on the table?")


def _roundtrip(msg):
    from rclpy.serialization import deserialize_message, serialize_message

    data = serialize_message(msg)
    assert isinstance(data, bytes) and len(data) > 0
    return deserialize_message(data, type(msg))


# --------------------------------------------------------------------------
# message definitions
# --------------------------------------------------------------------------


EXPECTED_FIELDS = {
    "ActionChunk": {
        "header": "std_msgs/Header",
        "frame_id": "uint64",
        "observation_seq": "uint64",
        "observation_stamp": "builtin_interfaces/Time",
        "offset": "uint32",
        "control_period": "float",
        "horizon": "uint32",
        "action_dim": "uint32",
        "actions": "sequence<float>",
    },
    "TextToken": {
        "header": "std_msgs/Header",
        "request_id": "uint64",
        "client_id": "string",
        "frame_id": "uint64",
        "observation_seq": "uint64",
        "observation_stamp": "builtin_interfaces/Time",
        "index": "uint32",
        "token_id": "int32",
        "piece": "string",
        "done": "boolean",
        "finish_reason": "string",
        "reason": "string",
    },
    "Observation": {
        "header": "std_msgs/Header",
        "seq": "uint64",
        "instruction": "string",
        "camera_names": "sequence<string>",
        "images": "sequence<sensor_msgs/Image>",
        "state": "sequence<float>",
    },
    "Question": {
        "header": "std_msgs/Header",
        "client_id": "string",
        "text": "string",
    },
}


@pytest.mark.parametrize("name", sorted(EXPECTED_FIELDS))
def test_fields(name):
    import oxygen_ros.msg

    cls = getattr(oxygen_ros.msg, name)
    assert cls.get_fields_and_field_types() == EXPECTED_FIELDS[name]


def test_text_token_finish_reasons():
    assert TextToken.FINISH_EOS == "eos"
    assert TextToken.FINISH_LENGTH == "length"
    assert TextToken.FINISH_REJECTED == "rejected"
    assert TextToken.FINISH_CANCELLED == "cancelled"
    fresh = TextToken()
    assert fresh.finish_reason == "" and fresh.done is False


def test_defaults():
    chunk = ActionChunk()
    assert isinstance(chunk.actions, array.array) and len(chunk.actions) == 0
    assert chunk.horizon == 0 and chunk.action_dim == 0 and chunk.offset == 0
    obs = Observation()
    assert list(obs.images) == [] and len(obs.state) == 0


@pytest.mark.parametrize("name", sorted(EXPECTED_FIELDS))
def test_every_field_is_documented(name):
    # Each field and constant in msg/<Name>.msg has a comment of its own
    # (on the lines just above it, or at the end of its line).
    lines = (REPO / "msg" / f"{name}.msg").read_text().splitlines()
    fields = []
    for i, line in enumerate(lines):
        body = line.split("#", 1)[0].strip()
        if not body:
            continue
        field = body.split()[1].split("=")[0]
        fields.append(field)
        inline = "#" in line
        above = i > 0 and lines[i - 1].strip().startswith("#")
        assert inline or above, f"{name}.{field} has no comment"
    assert set(EXPECTED_FIELDS[name]) <= set(fields)


# --------------------------------------------------------------------------
# serialization round trips
# --------------------------------------------------------------------------

@pytest.mark.parametrize(
    "make", [_sample_action_chunk, _sample_text_token, _sample_observation, _sample_question]
)


# --------------------------------------------------------------------------
# serialization round trips
# --------------------------------------------------------------------------


def test_roundtrip(make):
    msg = make()
    back = _roundtrip(msg)
    assert back == msg
    assert back is not msg


def test_observation_roundtrip_keeps_images():
    msg = _sample_observation()
    back = _roundtrip(msg)
    assert [img.encoding for img in back.images] == ["rgb8", "rgb8"]
    assert bytes(back.images[1].data) == bytes(msg.images[1].data)
    assert list(back.camera_names) == ["front", "wrist"]


def test_action_chunk_accepts_numpy():
    np = pytest.importorskip("numpy")
    actions = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    msg = ActionChunk(horizon=3, action_dim=4, actions=actions.ravel().tolist())
    back = _roundtrip(msg)
    got = np.frombuffer(back.actions, dtype=np.float32).reshape(back.horizon, back.action_dim)
    assert np.array_equal(got, actions)


_f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(
    horizon=st.integers(0, 12),
    dim=st.integers(1, 9),
    data=st.data(),
    frame_id=st.integers(0, 2**64 - 1),
    offset=st.integers(0, 2**32 - 1),
    period=_f32,
)


def test_action_chunk_roundtrip_property(horizon, dim, data, frame_id, offset, period):
    actions = data.draw(st.lists(_f32, min_size=horizon * dim, max_size=horizon * dim))
    msg = ActionChunk(
        header=_header(),
        frame_id=frame_id,
        observation_seq=frame_id // 3,
        offset=offset,
        control_period=period,
        horizon=horizon,
        action_dim=dim,
        actions=actions,
    )
    back = _roundtrip(msg)
    assert back == msg
    assert back.frame_id == frame_id and back.offset == offset
    assert list(back.actions) == [float(a) for a in actions]
    assert back.control_period == period or math.isclose(back.control_period, period)


# --------------------------------------------------------------------------
# real DDS
# --------------------------------------------------------------------------


def _unique_domain_id():
    # 1..100 are valid domain ids with the default port mapping on Linux.
    return random.Random(os.getpid() ^ time.time_ns()).randint(1, 100)


def test_action_chunk_over_dds(tmp_path, monkeypatch):
    domain = _unique_domain_id()
    monkeypatch.setenv("ROS_DOMAIN_ID", str(domain))
    monkeypatch.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    monkeypatch.setenv("ROS_LOG_DIR", str(tmp_path / "ros_log"))

    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

    qos = QoSProfile(
        history=HistoryPolicy.KEEP_LAST,
        depth=10,
        reliability=ReliabilityPolicy.RELIABLE,
        durability=DurabilityPolicy.VOLATILE,
    )
    topic = f"/oxygen_ros_test/action_chunk_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    sent = _sample_action_chunk()

    context = Context()  # private context: leaves the default one alone
    rclpy.init(context=context, domain_id=domain)
    executor = None
    nodes = []
    try:
        assert context.get_domain_id() == domain
        suffix = uuid.uuid4().hex[:8]
        talker = rclpy.create_node(f"oxygen_test_talker_{suffix}", context=context)
        listener = rclpy.create_node(f"oxygen_test_listener_{suffix}", context=context)
        nodes = [talker, listener]
        received = []
        listener.create_subscription(ActionChunk, topic, received.append, qos)
        publisher = talker.create_publisher(ActionChunk, topic, qos)
        executor = SingleThreadedExecutor(context=context)
        for node in nodes:
            executor.add_node(node)

        deadline = time.monotonic() + 30.0
        next_publish = 0.0
        while not received and time.monotonic() < deadline:
            if time.monotonic() >= next_publish:
                publisher.publish(sent)
                next_publish = time.monotonic() + 0.2
            executor.spin_once(timeout_sec=0.05)

        assert received, f"no ActionChunk received on {topic} (domain {domain}) within 30 s"
        got = received[0]
        assert isinstance(got, ActionChunk)
        assert got == sent
        assert publisher.get_subscription_count() >= 1
    finally:
        if executor is not None:
            executor.shutdown()
        for node in nodes:
            node.destroy_node()
        rclpy.shutdown(context=context)

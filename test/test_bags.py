"""Tests of oxygen_ros.ros.bags (write/read) and the BagPlayer node on real DDS.

The player tests run the node in a private rclpy context (see the `ros`
fixture; `make test` sets ROS_DOMAIN_ID, ROS_AUTOMATIC_DISCOVERY_RANGE and
ROS_LOG_DIR, the fixture sets them when missing) on topic names of their own.
"""

import itertools
import time

import numpy as np
import pytest
from ros_harness import SteppedRos, ros_environment

STORAGES = ["mcap", "sqlite3"]


@pytest.fixture
def ros(tmp_path, monkeypatch):
    """A private, initialised rclpy context with an executor the test spins; nodes added with ros.add()."""
    ros_environment(monkeypatch, tmp_path)
    with SteppedRos() as r:
        yield r


def _params(**values):
    from rclpy.parameter import Parameter

    return [Parameter(k, value=v) for k, v in values.items()]


T0 = 1_700_000_000_000_000_000  # recorded time of the first message (ns)


def _messages(prefix="", images=6, spacing_ns=20_000_000):
    """A small recording: a latched instruction, images with joint states in between."""
    from sensor_msgs.msg import JointState
    from std_msgs.msg import String

    from oxygen_ros.ros.conversions import ns_to_time_msg, rgb_to_image_msg

    out = [(f"{prefix}/oxygen/instruction", String(data="move to the blue square"), T0)]
    for i in range(images):
        t = T0 + (i + 1) * spacing_ns
        rgb = np.full((8, 12, 3), i * 10, np.uint8)
        out.append((f"{prefix}/camera/image_raw", rgb_to_image_msg(rgb, "rgb8", ns_to_time_msg(t - 1000), "cam"), t))
        state = JointState(name=["gripper_x", "gripper_y"], position=[i * 0.1, -i * 0.1])
        state.header.stamp = ns_to_time_msg(t + 500)
        out.append((f"{prefix}/joint_states", state, t + 1000))
    return out


# --------------------------------------------------------------------------
# write_bag / read_bag
# --------------------------------------------------------------------------

@pytest.mark.parametrize("storage", STORAGES)
def test_write_then_read_is_equal(tmp_path, storage):
    from oxygen_ros.core.observation import Observation
    from oxygen_ros.ros.bags import bag_topics, open_bag, read_bag, write_bag
    from oxygen_ros.ros.conversions import action_chunk_msg, observation_to_msg

    messages = _messages(images=3)
    obs = Observation(images={"base": np.zeros((4, 4, 3), np.uint8)}, instruction="x", state=np.ones(2, np.float32))
    messages.append(("/oxygen/observation", observation_to_msg(obs, 5), T0 + 10**9))
    messages.append(("/oxygen/actions", action_chunk_msg(1.0, 1, 5, 0.5, 0, 0.125, np.ones((3, 2))), T0 + 2 * 10**9))

    path = write_bag(tmp_path / "bag", storage, messages, latched_topics=["/oxygen/instruction"])
    assert (path / "metadata.yaml").is_file()
    assert next(path.glob("*.mcap" if storage == "mcap" else "*.db3")).is_file()
    back = read_bag(path)
    assert [(t, s) for t, _, s in back] == [(t, s) for t, _, s in messages]
    assert [m for _, m, _ in back] == [m for _, m, _ in messages]

    reader = open_bag(path)
    try:
        topics = bag_topics(reader)
    finally:
        reader.close()
    assert topics["/oxygen/instruction"].latched and not topics["/camera/image_raw"].latched
    assert topics["/camera/image_raw"].count == 3
    assert topics["/oxygen/observation"].msgtype == "oxygen_ros/msg/Observation"


def test_bag_errors(tmp_path):
    from std_msgs.msg import String

    from oxygen_ros.ros.bags import BagError, read_bag, write_bag

    with pytest.raises(BagError, match="storage"):
        write_bag(tmp_path / "a", "rosbag1", [])
    write_bag(tmp_path / "b", "mcap", [("/x", String(data="1"), 1)])
    with pytest.raises(BagError, match="exists"):
        write_bag(tmp_path / "b", "mcap", [])
    with pytest.raises(BagError, match="does not exist"):
        read_bag(tmp_path / "nope")
    with pytest.raises(BagError, match="not a ROS message"):
        write_bag(tmp_path / "c", "mcap", [("/x", "a string", 1)])
    from std_msgs.msg import Int32

    with pytest.raises(BagError, match="carries"):
        write_bag(tmp_path / "d", "sqlite3", [("/x", String(data="1"), 1), ("/x", Int32(data=1), 2)])


# --------------------------------------------------------------------------
# BagPlayer
# --------------------------------------------------------------------------

def _player(ros, bag, **values):
    from oxygen_ros.ros.bag_player import BagPlayer

    defaults = {"bag_path": str(bag), "start_delay_s": 0.0, "shutdown_when_done": True}
    defaults.update(values)
    return ros.add(BagPlayer(context=ros.context, parameter_overrides=_params(**defaults)))


class _Listener:
    """Subscribes to the recording's topics; keeps (topic, message, arrival time)."""

    def __init__(self, ros, prefix):
        from rclpy.qos import qos_profile_sensor_data
        from sensor_msgs.msg import Image, JointState

        self.node = ros.node("oxygen_test_listener")
        self.got = []
        for topic, cls in ((f"{prefix}/camera/image_raw", Image), (f"{prefix}/joint_states", JointState)):
            self.node.create_subscription(cls, topic, lambda m, t=topic: self.got.append((t, m, time.monotonic())),
                                          qos_profile_sensor_data if cls is Image else 10)

    def on(self, topic):
        return [(m, at) for t, m, at in self.got if t == topic]


def _wait_matched(ros, player, topics):
    pubs = [player._publishers_by_topic[t] for t in topics]
    assert ros.spin_until(lambda: all(p.get_subscription_count() >= 1 for p in pubs))


@pytest.mark.parametrize("storage", STORAGES)
def test_player_replays_in_recorded_order_and_timing(ros, tmp_path, storage):
    from std_msgs.msg import String

    from oxygen_ros.ros.bags import write_bag
    from oxygen_ros.ros.qos import LATCHED_QOS
    from oxygen_ros.ros.conversions import stamp_to_ns

    p = ros.prefix
    recording = _messages(p, images=6, spacing_ns=40_000_000)  # 6 images over 0.24 s
    bag = write_bag(tmp_path / "bag", storage, recording, latched_topics=[f"{p}/oxygen/instruction"])
    listener = _Listener(ros, p)
    player = _player(ros, bag, rate=2.0, start_delay_s=5.0)  # the delay is cut short below
    image_topic, state_topic = f"{p}/camera/image_raw", f"{p}/joint_states"
    _wait_matched(ros, player, [image_topic, state_topic])
    player._start_at = 0.0
    assert ros.spin_until(lambda: player.finished)
    assert player.done.done() and player.published == len(recording)
    assert ros.spin_until(lambda: len(listener.got) == 12, timeout=5.0), len(listener.got)

    images = listener.on(image_topic)
    expected = [m for t, m, _ in recording if t == image_topic]
    assert [bytes(m.data) for m, _ in images] == [bytes(m.data) for m in expected]  # recorded order
    assert [list(m.position) for m, _ in listener.on(state_topic)] == \
        [list(m.position) for t, m, _ in recording if t == state_topic]
    # recorded timing at rate 2: 5 gaps of 40 ms -> 100 ms
    span = images[-1][1] - images[0][1]
    assert 0.08 <= span < 1.0, span
    # restamped: header stamps moved to now, their recorded spacing kept
    stamps = [stamp_to_ns(m.header.stamp) for m, _ in images]
    now = ros.nodes[0].get_clock().now().nanoseconds
    assert all(abs(now - s) < 10 * 10**9 for s in stamps)
    assert all(b > a for a, b in itertools.pairwise(stamps))

    # the instruction was published latched: a late subscriber still gets it
    late = ros.node("oxygen_test_late")
    instructions = []
    late.create_subscription(String, f"{p}/oxygen/instruction", instructions.append, LATCHED_QOS)
    assert ros.spin_until(lambda: instructions)
    assert instructions[0].data == "move to the blue square"


def test_player_topic_filter_loop_and_original_stamps(ros, tmp_path):
    from oxygen_ros.ros.bags import write_bag

    p = ros.prefix
    recording = _messages(p, images=3, spacing_ns=1_000_000)
    bag = write_bag(tmp_path / "bag", "mcap", recording)
    listener = _Listener(ros, p)
    image_topic = f"{p}/camera/image_raw"
    player = _player(ros, bag, topics=[image_topic], loop=True, restamp=False, start_delay_s=5.0)
    assert list(player._publishers_by_topic) == [image_topic]
    _wait_matched(ros, player, [image_topic])
    player._start_at = 0.0
    assert ros.spin_until(lambda: player.passes >= 3)
    assert not player.finished
    assert ros.spin_until(lambda: len(listener.on(image_topic)) >= 6)
    assert listener.on(f"{p}/joint_states") == []
    recorded = [m.header.stamp for t, m, _ in recording if t == image_topic]
    assert [m.header.stamp for m, _ in listener.on(image_topic)[:6]] == recorded * 2


@pytest.mark.parametrize("answer", [True, False], ids=["answered", "timeout"])
def test_player_lockstep_waits_for_action_chunks(ros, tmp_path, answer):
    """Each image is held until an ActionChunk for a newer observation arrives
    (or lockstep_timeout_s passes); joint states are not held."""
    from oxygen_ros.msg import ActionChunk
    from sensor_msgs.msg import Image

    from oxygen_ros.ros.bags import write_bag
    from oxygen_ros.ros.conversions import action_chunk_msg

    p = ros.prefix
    n = 5
    recording = _messages(p, images=n, spacing_ns=1_000_000)  # 1 ms apart: all due at once
    bag = write_bag(tmp_path / "bag", "sqlite3", recording)
    image_topic = f"{p}/camera/image_raw"
    delay, timeout = 0.15, 0.3

    policy = ros.node("oxygen_test_policy")
    actions = policy.create_publisher(ActionChunk, f"{p}/actions", 10)
    seen, answers, due = [], [], []

    def on_image(msg):
        seen.append(time.monotonic())
        if answer:
            due.append(time.monotonic() + delay)  # "inference" takes `delay`

    policy.create_subscription(Image, image_topic, on_image, 10)

    def respond():
        while due and time.monotonic() >= due[0]:
            due.pop(0)
            actions.publish(action_chunk_msg(0.0, len(answers), len(answers), 0.0, 0, 0.1, np.zeros((2, 2))))
            answers.append(time.monotonic())

    player = _player(ros, bag, lockstep=True, lockstep_timeout_s=timeout, action_topic=f"{p}/actions",
                     start_delay_s=5.0)
    _wait_matched(ros, player, [image_topic])
    assert ros.spin_until(lambda: actions.get_subscription_count() >= 1)
    player._start_at = 0.0
    assert ros.spin_until(lambda: player.finished and len(seen) == n, timeout=15.0, every=respond, period=0.005)

    gaps = np.diff(seen)
    if answer:
        assert player.lockstep_timeouts == 0
        assert player.action_seq == n - 2  # the last image's answer may still be pending
        for k in range(1, n):  # image k went out only after the answer to image k-1
            assert seen[k] >= answers[k - 1], (seen, answers)
        assert gaps.min() >= delay * 0.9, gaps
    else:
        assert player.lockstep_timeouts == n - 1
        assert gaps.min() >= timeout * 0.9, gaps


def test_player_refuses_bad_parameters(ros, tmp_path):
    from oxygen_ros.ros.bags import write_bag
    from oxygen_ros.ros.parameters import ParameterError
    from oxygen_ros.ros.bag_player import BagPlayer

    with pytest.raises(ParameterError, match="'bag_path'"):
        BagPlayer(context=ros.context)
    with pytest.raises(ParameterError, match="'bag_path'.*does not exist"):
        BagPlayer(context=ros.context, parameter_overrides=_params(bag_path=str(tmp_path / "missing")))
    bag = write_bag(tmp_path / "bag", "mcap", _messages(images=1))
    with pytest.raises(ParameterError, match="'rate'"):
        BagPlayer(context=ros.context, parameter_overrides=_params(bag_path=str(bag), rate=0.0))
    with pytest.raises(ParameterError, match="'topics'.*nothing to play"):
        BagPlayer(context=ros.context, parameter_overrides=_params(bag_path=str(bag), topics=["/other"]))
    player = _player(ros, bag, start_delay_s=60.0)
    from rclpy.parameter import Parameter

    result = player.set_parameters([Parameter("rate", value=-1.0)])[0]
    assert not result.successful and "rate" in result.reason
    assert player.set_parameters([Parameter("rate", value=4)])[0].successful and player.rate == 4.0
    assert not player.set_parameters([Parameter("bag_path", value="/x")])[0].successful

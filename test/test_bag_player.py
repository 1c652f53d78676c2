"""The BagPlayer node on real DDS: recorded order and timing, topic filter, loop,
original stamps, lockstep with the ActionChunks of a policy, the wait for subscribers
(nothing of a bag is lost to discovery), parameter checks.

Every test runs its nodes in a private rclpy context (the ``stepped_ros`` fixture; `make
test` sets ROS_DOMAIN_ID, ROS_AUTOMATIC_DISCOVERY_RANGE and ROS_LOG_DIR, the fixture sets
them when missing) on topic names of its own.
"""

import itertools
import time

import numpy as np
import pytest
from message_builders import RECORDED_T0, bag_recording, bag_with_old_text_tokens
from ros_harness import params

STORAGES = ["mcap", "sqlite3"]


def _player(stepped_ros, bag, **values):
    from oxygen_ros.ros.bag_player import BagPlayer

    defaults = {"bag_path": str(bag), "shutdown_when_done": True}
    defaults.update(values)
    return stepped_ros.add(BagPlayer(context=stepped_ros.context, parameter_overrides=params(**defaults)))


class _Listener:
    """Subscribes to the recording's topics; keeps (topic, message, arrival time). Images
    are taken best effort, as a camera consumer does, with a queue deep enough for a
    whole test: the player publishes faster than a listener spun on the same executor
    takes them (with sensor data QoS's depth of 5 the oldest were dropped now and then)."""

    def __init__(self, stepped_ros, prefix):
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from sensor_msgs.msg import Image, JointState

        self.node = stepped_ros.node("oxygen_test_listener")
        self.got = []
        images = QoSProfile(depth=100, reliability=ReliabilityPolicy.BEST_EFFORT)
        for topic, cls in ((f"{prefix}/camera/image_raw", Image), (f"{prefix}/joint_states", JointState)):
            self.node.create_subscription(cls, topic, lambda m, t=topic: self.got.append((t, m, time.monotonic())),
                                          images if cls is Image else 10)

    def on(self, topic):
        return [(m, at) for t, m, at in self.got if t == topic]


def _three_images(stepped_ros, tmp_path):
    """A bag of three images 1 ms apart (with an instruction and joint states), a listener, and
    the image topic."""
    from oxygen_ros.ros.bags import write_bag

    p = stepped_ros.prefix
    bag = write_bag(tmp_path / "bag", "mcap", bag_recording(p, images=3, spacing_ns=1_000_000))
    return bag, _Listener(stepped_ros, p), f"{p}/camera/image_raw"


def _wait_matched(stepped_ros, player, topics):
    pubs = [player.publishers_by_topic[t] for t in topics]
    assert stepped_ros.spin_until(lambda: all(p.get_subscription_count() >= 1 for p in pubs))


@pytest.mark.parametrize("storage", STORAGES)
def test_player_replays_in_recorded_order_and_timing(stepped_ros, tmp_path, storage):
    from std_msgs.msg import String

    from oxygen_ros.ros.bags import write_bag
    from oxygen_ros.ros.qos import LATCHED_QOS
    from oxygen_ros.ros.conversions import stamp_to_ns

    p = stepped_ros.prefix
    recording = bag_recording(p, images=6, spacing_ns=100_000_000)  # 6 images over 0.6 s
    bag = write_bag(tmp_path / "bag", storage, recording, latched_topics=[f"{p}/oxygen/instruction"])
    listener = _Listener(stepped_ros, p)
    player = _player(stepped_ros, bag, rate=2.0, start_delay_s=5.0)  # the delay is cut short below
    image_topic, state_topic = f"{p}/camera/image_raw", f"{p}/joint_states"
    _wait_matched(stepped_ros, player, [image_topic, state_topic])
    player.start_now()
    assert stepped_ros.spin_until(lambda: player.finished)
    assert player.done.done() and player.published == len(recording)
    assert stepped_ros.spin_until(lambda: len(listener.got) == 12, timeout=5.0), len(listener.got)

    images = listener.on(image_topic)
    expected = [m for t, m, _ in recording if t == image_topic]
    assert [bytes(m.data) for m, _ in images] == [bytes(m.data) for m in expected]  # recorded order
    assert [list(m.position) for m, _ in listener.on(state_topic)] == \
        [list(m.position) for t, m, _ in recording if t == state_topic]
    # recorded timing at rate 2: 5 gaps of 100 ms -> 250 ms (slowed down by the rate, 1 s: too slow)
    span = images[-1][1] - images[0][1]
    assert 0.15 <= span < 0.6, span
    # restamped: header stamps moved to now, their recorded spacing kept
    stamps = [stamp_to_ns(m.header.stamp) for m, _ in images]
    now = stepped_ros.nodes[0].get_clock().now().nanoseconds
    assert all(abs(now - s) < 10 * 10**9 for s in stamps)
    assert all(b > a for a, b in itertools.pairwise(stamps))

    # the instruction was published latched: a late subscriber still gets it
    late = stepped_ros.node("oxygen_test_late")
    instructions = []
    late.create_subscription(String, f"{p}/oxygen/instruction", instructions.append, LATCHED_QOS)
    assert stepped_ros.spin_until(lambda: instructions)
    assert instructions[0].data == "move to the blue square"


def test_player_topic_filter_loop_and_original_stamps(stepped_ros, tmp_path):
    from oxygen_ros.ros.bags import write_bag

    p = stepped_ros.prefix
    recording = bag_recording(p, images=3, spacing_ns=1_000_000)
    bag = write_bag(tmp_path / "bag", "mcap", recording)
    listener = _Listener(stepped_ros, p)
    image_topic = f"{p}/camera/image_raw"
    player = _player(stepped_ros, bag, topics=[image_topic], loop=True, restamp=False, start_delay_s=5.0)
    assert list(player.publishers_by_topic) == [image_topic]
    _wait_matched(stepped_ros, player, [image_topic])
    player.start_now()
    assert stepped_ros.spin_until(lambda: player.passes >= 3)
    assert not player.finished
    assert stepped_ros.spin_until(lambda: len(listener.on(image_topic)) >= 6)
    assert listener.on(f"{p}/joint_states") == []
    recorded = [m.header.stamp for t, m, _ in recording if t == image_topic]
    assert [m.header.stamp for m, _ in listener.on(image_topic)[:6]] == recorded * 2


def test_player_paces_on_steady_time_whatever_its_ros_clock_does(stepped_ros, tmp_path):
    """The player's ROS clock standing still (here use_sim_time with no /clock; on wall time, the
    system clock stepped back, as NTP does) does not stop the replay: its ticks are on steady time."""
    bag, listener, image_topic = _three_images(stepped_ros, tmp_path)
    player = _player(stepped_ros, bag, topics=[image_topic], restamp=False, use_sim_time=True)
    assert player.get_clock().now().nanoseconds == 0  # no /clock: ROS time stands at zero
    _wait_matched(stepped_ros, player, [image_topic])
    player.start_now()
    assert stepped_ros.spin_until(lambda: player.done.done(), timeout=10.0), (player.published, player.passes)
    assert stepped_ros.spin_until(lambda: len(listener.on(image_topic)) == 3)


def test_start_now_holds_when_it_lands_inside_the_tick_that_ends_the_wait(stepped_ros, tmp_path):
    """A caller's start_now() that comes while the player's own tick is ending its wait for
    subscribers (between its check and its setting start_delay_s) still starts the player at
    once, not start_delay_s later: the interleaving is forced here by a player that is told
    start_now() from inside that check, as another thread's call can land there."""
    from oxygen_ros.ros.bag_player import BagPlayer

    class _Interleaved(BagPlayer):
        def unmatched_topics(self):
            unmatched = super().unmatched_topics()
            if not unmatched:
                self.start_now()
            return unmatched

    bag, listener, image_topic = _three_images(stepped_ros, tmp_path)
    player = stepped_ros.add(_Interleaved(context=stepped_ros.context, parameter_overrides=params(
        bag_path=str(bag), topics=[image_topic], start_delay_s=60.0)))
    assert stepped_ros.spin_until(lambda: player.done.done(), timeout=10.0), (player.published, player.passes)
    assert stepped_ros.spin_until(lambda: len(listener.on(image_topic)) == 3)


@pytest.mark.parametrize("answer", [True, False], ids=["answered", "timeout"])
def test_player_lockstep_waits_for_action_chunks(stepped_ros, tmp_path, answer):
    """Each image is held until an ActionChunk for a newer observation arrives
    (or lockstep_timeout_s passes); joint states are not held."""
    from oxygen_ros.msg import ActionChunk
    from sensor_msgs.msg import Image

    from oxygen_ros.ros.bags import write_bag
    from oxygen_ros.ros.conversions import action_chunk_msg

    p = stepped_ros.prefix
    n = 5
    recording = bag_recording(p, images=n, spacing_ns=1_000_000)  # 1 ms apart: all due at once
    bag = write_bag(tmp_path / "bag", "sqlite3", recording)
    image_topic = f"{p}/camera/image_raw"
    delay = 0.15  # answered: far inside the timeout (a stall of the test's executor is no timeout)
    timeout = 2.0 if answer else 0.3

    policy = stepped_ros.node("oxygen_test_policy")
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

    player = _player(stepped_ros, bag, lockstep=True, lockstep_timeout_s=timeout, action_topic=f"{p}/actions",
                     start_delay_s=5.0)
    _wait_matched(stepped_ros, player, [image_topic])
    assert stepped_ros.spin_until(lambda: actions.get_subscription_count() >= 1)
    player.start_now()
    assert stepped_ros.spin_until(lambda: player.finished and len(seen) == n, timeout=15.0, every=respond, period=0.005)

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


def test_player_lockstep_keeps_the_recorded_spacing_after_a_hold(stepped_ros, tmp_path):
    """Images 200 ms apart with joint states every 20 ms between them; the policy answers
    each image 0.5 s later, so every image after the first is held about 0.3 s. After the
    hold the states that follow it play at their recorded spacing, not in one burst."""
    from oxygen_ros.msg import ActionChunk
    from sensor_msgs.msg import Image, JointState

    from oxygen_ros.ros.bags import write_bag
    from oxygen_ros.ros.conversions import action_chunk_msg, ns_to_time_msg, rgb_to_image_msg

    p = stepped_ros.prefix
    image_topic, state_topic = f"{p}/camera/image_raw", f"{p}/joint_states"
    n, image_gap, state_gap, states = 4, 200_000_000, 20_000_000, 9
    recording = []
    for i in range(n):
        t = RECORDED_T0 + i * image_gap
        recording.append((image_topic, rgb_to_image_msg(np.full((8, 12, 3), i, np.uint8), "rgb8",
                                                        ns_to_time_msg(t), "cam"), t))
        for k in range(1, states + 1):
            state = JointState(name=["j"], position=[float(i * 100 + k)])
            state.header.stamp = ns_to_time_msg(t + k * state_gap)
            recording.append((state_topic, state, t + k * state_gap))
    bag = write_bag(tmp_path / "bag", "mcap", recording)
    delay = 0.5

    policy = stepped_ros.node("oxygen_test_policy")
    actions = policy.create_publisher(ActionChunk, f"{p}/actions", 10)
    images, arrivals, due, answers = [], [], [], []

    def on_image(msg):
        images.append(time.monotonic())
        due.append(time.monotonic() + delay)  # "inference" takes `delay`

    policy.create_subscription(Image, image_topic, on_image, 10)
    policy.create_subscription(JointState, state_topic, lambda m: arrivals.append((m.position[0], time.monotonic())),
                               100)

    def respond():
        while due and time.monotonic() >= due[0]:
            due.pop(0)
            actions.publish(action_chunk_msg(0.0, len(answers), len(answers), 0.0, 0, 0.1, np.zeros((2, 2))))
            answers.append(time.monotonic())

    player = _player(stepped_ros, bag, lockstep=True, lockstep_timeout_s=10.0, action_topic=f"{p}/actions",
                     start_delay_s=5.0)
    _wait_matched(stepped_ros, player, [image_topic, state_topic])
    assert stepped_ros.spin_until(lambda: actions.get_subscription_count() >= 1)
    player.start_now()
    assert stepped_ros.spin_until(lambda: player.finished and len(images) == n and len(arrivals) == n * states,
                                  timeout=30.0, every=respond, period=0.005), (len(images), len(arrivals))
    assert player.lockstep_timeouts == 0
    assert min(np.diff(images)) >= delay * 0.9, "each image after the first was held for the answer"

    recorded_span = (states - 1) * state_gap / 1e9  # 160 ms between an image's first and last state
    for i in range(1, n):  # the states after each held image
        at = [a for position, a in arrivals if i * 100 < position < (i + 1) * 100]
        assert len(at) == states
        span = at[-1] - at[0]
        assert span >= 0.6 * recorded_span, (i, span)  # a burst would arrive within a few ms


def _images_and_instruction(p, images=5):
    """A short recording: the latched instruction at its very start, then ``images`` images."""
    return [r for r in bag_recording(p, images=images) if not r[0].endswith("/joint_states")]


def _image_subscriber(node, topic, into):
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import Image

    # best effort, as a camera consumer subscribes: it drops what comes before it has matched
    node.create_subscription(Image, topic, into.append, QoSProfile(depth=10, reliability=ReliabilityPolicy.BEST_EFFORT))


def test_player_waits_for_a_subscriber_on_every_topic_and_nothing_is_lost(stepped_ros, tmp_path):
    """A subscriber started before the player (images) and one started a second after it
    (instruction and images): the player plays only once every topic has a subscriber, so
    both get every image of the bag and the late one the latched instruction too."""
    from std_msgs.msg import String

    from oxygen_ros.ros.bags import write_bag
    from oxygen_ros.ros.qos import LATCHED_QOS

    p = stepped_ros.prefix
    image_topic, instruction_topic = f"{p}/camera/image_raw", f"{p}/oxygen/instruction"
    recording = _images_and_instruction(p)
    bag = write_bag(tmp_path / "bag", "mcap", recording, latched_topics=[instruction_topic])
    expected = [bytes(m.data) for t, m, _ in recording if t == image_topic]

    early_images, late_images, late_instructions = [], [], []
    _image_subscriber(stepped_ros.node("oxygen_test_early"), image_topic, early_images)
    player = _player(stepped_ros, bag, wait_for_subscribers_s=60.0)  # defaults otherwise; no start_now()
    assert stepped_ros.spin_until(lambda: player.unmatched_topics() == [instruction_topic])
    stepped_ros.spin_for(1.0)  # twice the fixed start delay the player used to have
    assert player.published == 0 and early_images == []  # a topic has no subscriber yet: nothing played

    late = stepped_ros.node("oxygen_test_late")
    late.create_subscription(String, instruction_topic, late_instructions.append, LATCHED_QOS)
    _image_subscriber(late, image_topic, late_images)
    assert stepped_ros.spin_until(lambda: player.finished, timeout=30.0)
    assert player.published == len(recording)
    assert stepped_ros.spin_until(lambda: len(early_images) == len(late_images) == len(expected)
                                  and late_instructions, timeout=10.0), (len(early_images), len(late_images))
    assert [bytes(m.data) for m in early_images] == expected
    assert [bytes(m.data) for m in late_images] == expected
    assert [m.data for m in late_instructions] == ["move to the blue square"]


def test_player_without_subscribers_names_them_after_the_timeout_and_plays_anyway(stepped_ros, tmp_path):
    from rcl_interfaces.msg import Log
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

    from oxygen_ros.ros.bags import write_bag

    p = stepped_ros.prefix
    recording = _images_and_instruction(p, images=3)
    bag = write_bag(tmp_path / "bag", "sqlite3", recording, latched_topics=[f"{p}/oxygen/instruction"])
    logs = []
    stepped_ros.node("oxygen_test_rosout").create_subscription(Log, "/rosout", logs.append, QoSProfile(
        depth=1000, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL))
    player = _player(stepped_ros, bag, wait_for_subscribers_s=0.5)
    assert stepped_ros.spin_until(lambda: player.finished, timeout=30.0)
    assert player.published == len(recording)  # played anyway

    def warnings():
        return [m for m in logs if "nothing matched" in m.msg and p in m.msg]

    assert stepped_ros.spin_until(warnings)
    (warning,) = warnings()
    assert warning.level == Log.WARN
    assert f"{p}/camera/image_raw" in warning.msg and f"{p}/oxygen/instruction" in warning.msg


def test_a_bag_of_a_running_agent_plays_the_robot_s_inputs_not_the_stack_s_outputs(stepped_ros, tmp_path):
    """``ros2 bag record -a`` of a running agent holds its ActionChunks (also a robot's, under
    /left), /clock...: played, they would reach the robot and answer the lockstep's own images.
    By default only the inputs play; listing a lockstep ActionChunk topic is refused."""
    from oxygen_ros.msg import ActionChunk
    from rosgraph_msgs.msg import Clock

    from oxygen_ros.ros.bags import write_bag
    from oxygen_ros.ros.parameters import ParameterError

    p = stepped_ros.prefix
    t = bag_recording(p, images=1)[-1][2]
    outputs = [(f"{p}/oxygen/actions", ActionChunk(observation_seq=1008), t + 1),
               (f"{p}/left/oxygen/actions", ActionChunk(observation_seq=7), t + 2), ("/clock", Clock(), t + 3)]
    bag = write_bag(tmp_path / "bag", "mcap", bag_recording(p, images=1) + outputs)
    player = _player(stepped_ros, bag, start_delay_s=60.0, lockstep=True, action_topic=f"{p}/oxygen/actions")
    assert sorted(player.publishers_by_topic) == sorted([f"{p}/oxygen/instruction", f"{p}/camera/image_raw",
                                                         f"{p}/joint_states"])
    with pytest.raises(ParameterError, match="'topics'.*ActionChunks this player waits on"):
        _player(stepped_ros, bag, topics=[f"{p}/camera/image_raw", f"{p}/oxygen/actions"],
                action_topic=f"{p}/oxygen/actions")


def test_an_exclude_topics_of_ones_own_is_told_when_it_lets_the_stack_s_outputs_through(stepped_ros, tmp_path,
                                                                                          capfd):
    """An ``exclude_topics`` set by hand replaces the default list: the bag's old ActionChunks on
    the topic the player waits on in lockstep are refused (as when named in ``topics``), the
    other outputs are played with a warning, and an excluded name the bag lacks is named."""
    from oxygen_ros.msg import ActionChunk, TextToken

    from oxygen_ros.ros.bags import write_bag
    from oxygen_ros.ros.parameters import ParameterError

    p = stepped_ros.prefix
    t = bag_recording(p, images=1)[-1][2]
    outputs = [(f"{p}/oxygen/actions", ActionChunk(observation_seq=3), t + 1),
               (f"{p}/oxygen/text", TextToken(piece="old"), t + 2)]
    bag = write_bag(tmp_path / "bag", "mcap", bag_recording(p, images=1) + outputs)
    with pytest.raises(ParameterError, match=r"'exclude_topics'.*oxygen/actions'\] carry the ActionChunks"):
        _player(stepped_ros, bag, exclude_topics=["/diagnostics"], action_topic=f"{p}/oxygen/actions")
    player = _player(stepped_ros, bag, start_delay_s=60.0, exclude_topics=[f"{p}/oxygen/actions", "/camera/imag_raw"],
                     action_topic=f"{p}/oxygen/actions")
    assert f"{p}/oxygen/text" in player.publishers_by_topic
    err = capfd.readouterr().err
    assert f"playing ['{p}/oxygen/text'], the stack's own outputs or ROS's bookkeeping as recorded" in err, err
    assert "exclude_topics names ['/camera/imag_raw'], which the bag does not hold" in err, err


def test_a_topic_recorded_with_another_definition_is_not_played_and_said_so(stepped_ros, tmp_path, capfd):
    """A bag of an older oxygen_ros: its TextTokens cannot be read here (rclpy failed on the first
    one, mid-play, with a traceback). Asked for, the topic is left out with the reason; alone,
    there is nothing to play."""
    from oxygen_ros.ros.parameters import ParameterError

    p = stepped_ros.prefix
    bag = bag_with_old_text_tokens(tmp_path / "old", bag_recording(p, images=1), text_topic=f"{p}/oxygen/text")
    image = f"{p}/camera/image_raw"
    player = _player(stepped_ros, bag, start_delay_s=60.0, topics=[image, f"{p}/oxygen/text"])
    assert list(player.publishers_by_topic) == [image]
    err = capfd.readouterr().err
    assert (f"not playing {p}/oxygen/text: recorded with another definition of oxygen_ros/msg/TextToken "
            "(type hash RIHS01_") in err, err
    with pytest.raises(ParameterError, match="'topics'.*nothing to play.*can be read here"):
        _player(stepped_ros, bag, topics=[f"{p}/oxygen/text"])


def test_a_rate_change_keeps_the_wait_for_the_next_message(stepped_ros, tmp_path):
    """Two messages 20 s apart: doubling the rate after the first leaves 10 s to wait, not none."""
    from rclpy.parameter import Parameter
    from std_msgs.msg import String

    from oxygen_ros.ros.bags import write_bag

    p = stepped_ros.prefix
    notes = [(f"{p}/note", String(data="a"), 0), (f"{p}/note", String(data="b"), 20 * 10**9)]
    bag = write_bag(tmp_path / "bag", "mcap", notes)
    player = _player(stepped_ros, bag, wait_for_subscribers_s=0.0, start_delay_s=0.0)
    assert stepped_ros.spin_until(lambda: player.published == 1)
    assert player.set_parameters([Parameter("rate", value=2.0)])[0].successful
    stepped_ros.spin_for(1.0)
    assert player.published == 1  # the second is 10 s away at rate 2


def test_player_refuses_bad_parameters(stepped_ros, tmp_path):
    from oxygen_ros.ros.bags import write_bag
    from oxygen_ros.ros.parameters import ParameterError
    from oxygen_ros.ros.bag_player import BagPlayer

    with pytest.raises(ParameterError, match="'bag_path'"):
        BagPlayer(context=stepped_ros.context)
    with pytest.raises(ParameterError, match="'bag_path'.*does not exist"):
        BagPlayer(context=stepped_ros.context, parameter_overrides=params(bag_path=str(tmp_path / "missing")))
    bag = write_bag(tmp_path / "bag", "mcap", bag_recording(images=1))
    with pytest.raises(ParameterError, match="'rate'"):
        BagPlayer(context=stepped_ros.context, parameter_overrides=params(bag_path=str(bag), rate=0.0))
    with pytest.raises(ParameterError, match="'topics'.*nothing to play"):
        BagPlayer(context=stepped_ros.context, parameter_overrides=params(bag_path=str(bag), topics=["/other"]))
    # every topic left out, and a recording that received nothing: each named for what it is
    every = sorted({topic for topic, _, _ in bag_recording(images=1)})
    with pytest.raises(ParameterError, match=r"'exclude_topics'.*nothing to play: every topic of the bag is excluded"):
        BagPlayer(context=stepped_ros.context, parameter_overrides=params(bag_path=str(bag), exclude_topics=every))
    empty = write_bag(tmp_path / "empty", "mcap", [])
    with pytest.raises(ParameterError, match=r"'bag_path'.*holds no topic \(a recording that received nothing\)"):
        BagPlayer(context=stepped_ros.context, parameter_overrides=params(bag_path=str(empty)))
    player = _player(stepped_ros, bag, start_delay_s=60.0)
    from rclpy.parameter import Parameter

    result = player.set_parameters([Parameter("rate", value=-1.0)])[0]
    assert not result.successful and "rate" in result.reason
    assert player.set_parameters([Parameter("rate", value=4)])[0].successful and player.rate == 4.0
    assert not player.set_parameters([Parameter("bag_path", value="/x")])[0].successful
    result = player.set_parameters([Parameter("use_sim_time", value=True)])[0]
    assert not result.successful and "'use_sim_time' is read at start" in result.reason


def test_a_recorded_agent_s_own_topics_and_bookkeeping_are_not_played_by_default():
    """What an `oxygen-record` of a running agent holds besides the robot's inputs: the stack's
    outputs (also a robot's, under its namespace), ROS's bookkeeping and every lifecycle node's
    transition events (played, they told a live lifecycle manager of transitions that never
    happened, and the player waited 5 s for a subscriber of them)."""
    from oxygen_ros.ros.bag_choice import OWN_TOPICS, excluded

    for topic in ("/oxygen/actions", "/left/oxygen/actions", "/oxygen_inference/transition_event",
                  "/left/oxygen_inference/transition_event", "/parameter_events", "/rosout", "/clock"):
        assert excluded(topic, OWN_TOPICS), topic
    for topic in ("/camera/image_raw", "/oxygen/instruction", "/joint_states", "/left/camera/image_raw"):
        assert not excluded(topic, OWN_TOPICS), topic

"""``oxygen-record`` (oxygen_ros/tools/record.py) records a running camera into a rosbag2 bag,
in a process of its own on real DDS, and the bag reads back as what was published: images
and states as they came, the latched instruction as latched."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from ros_harness import Ros, checkout_env, from_a_terminal, params, unique_prefix

from oxygen_ros.ros.bags import bag_topics, open_bag, read_bag


_STARTED: list[subprocess.Popen] = []  # the recorders of the test that runs


@pytest.fixture(autouse=True)
def _no_recorder_left():
    """A recorder that a failed test left running is killed at its end (it would record on for
    ever: two were found an hour after their tests had failed)."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _recorder(out, *args, **popen) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "oxygen_ros.tools.record", str(out), *args], env=checkout_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    _STARTED.append(proc)
    return proc


def _running_recorder(out, topic: str, *ignored: signal.Signals) -> subprocess.Popen:
    """A recorder of ``topic`` started as from a terminal with ``ignored`` signals ignored, once
    its node is in the graph (a signal from then on is the recorder's to handle)."""
    proc = _recorder(out, topic, preexec_fn=from_a_terminal(*ignored))
    with Ros() as ros:
        probe = ros.node("oxygen_test_record_probe")
        assert ros.wait_until(lambda: "oxygen_record" in {n for n, _ in probe.get_node_names_and_namespaces()},
                              30.0), proc.poll()
    return proc


def test_a_recording_of_the_synthetic_camera_reads_back_with_its_latched_instruction(ros_env, tmp_path):
    from oxygen_ros.ros.synthetic_camera import SyntheticCamera

    prefix = unique_prefix()
    topics = {"image_topic": f"{prefix}/image", "instruction_topic": f"{prefix}/instruction",
              "joint_state_topic": f"{prefix}/joint_states", "action_topic": f"{prefix}/actions"}
    out = tmp_path / "bag"
    with Ros() as ros:
        ros.add(SyntheticCamera(context=ros.context, parameter_overrides=params(rate_hz=20.0, **topics)))
        time.sleep(1.0)  # the instruction went out before the recorder started: it must come latched
        proc = _recorder(out, topics["image_topic"], topics["instruction_topic"], topics["joint_state_topic"],
                         "--duration", "6")
        stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert f"oxygen-record: {out}:" in stdout
    messages = read_bag(out)
    by_topic = {t: [m for topic, m, _ in messages if topic == t] for t in topics.values()}
    assert len(by_topic[topics["image_topic"]]) >= 20, {t: len(m) for t, m in by_topic.items()}
    assert len(by_topic[topics["joint_state_topic"]]) >= 20
    (instruction,) = by_topic[topics["instruction_topic"]]
    assert instruction.data.strip()
    image = by_topic[topics["image_topic"]][0]
    assert image.height == image.width > 0 and len(image.data) == image.height * image.step
    reader = open_bag(out)
    try:
        kinds = bag_topics(reader)
    finally:
        reader.close()
    assert kinds[topics["instruction_topic"]].latched and not kinds[topics["image_topic"]].latched
    stamps = [s for t, _, s in messages if t == topics["image_topic"]]
    # as received: in order, over the 6 s from the recorder's first message (the latched
    # instruction may come before the first image), never more
    assert stamps == sorted(stamps) and 0.5 < (stamps[-1] - stamps[0]) / 1e9 < 7.0


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP])
def test_a_recording_stopped_by_sigint_closes_its_bag_and_one_that_got_nothing_says_so(ros_env, tmp_path, signum):
    """Ctrl-C, and SIGHUP: a closed terminal or a dropped ssh session left an empty file, no bag.
    The recorder starts with its signals at their defaults, as from a terminal: one the suite inherited
    ignored (``nohup make test``, ``make test &``) it keeps ignored, as it should (the nohup test below)."""
    prefix = unique_prefix()
    proc = _running_recorder(tmp_path / "empty", f"{prefix}/nobody_publishes_this")
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "0 messages on 0 topic(s)" in stdout and f"nothing received on {prefix}/nobody_publishes_this" in stderr
    assert read_bag(tmp_path / "empty") == []  # a closed, readable bag
    again = _recorder(tmp_path / "empty", "--duration", "1")
    _, stderr = again.communicate(timeout=30)
    assert again.returncode == 2 and "exists already" in stderr  # never written over


@pytest.mark.parametrize("ignored, stopper", [(signal.SIGHUP, signal.SIGINT), (signal.SIGINT, signal.SIGTERM)])
def test_a_recording_started_with_a_signal_ignored_keeps_it_ignored(ros_env, tmp_path, ignored, stopper):
    """``nohup oxygen-record ... &`` starts it with SIGHUP ignored: a dropped ssh session must not
    end the recording (its SIGHUP handler took over the ignored signal); Ctrl-C still ends it. A
    script's ``oxygen-record ... &`` starts it with SIGINT ignored (POSIX shells start background
    jobs so): ``kill -INT`` did nothing, without a word; it says so at the start, and SIGTERM
    ends it. Either way the bag is closed."""
    prefix = unique_prefix()
    proc = _running_recorder(tmp_path / "bag", f"{prefix}/nobody_publishes_this", ignored)
    proc.send_signal(ignored)
    time.sleep(1.5)
    assert proc.poll() is None, f"{ignored.name} ended a recording that ignores it"
    proc.send_signal(stopper)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 1 and "0 messages on 0 topic(s)" in stdout
    notice = ("oxygen-record: SIGINT ignored, as this process was started (a background job of a script, nohup): "
              "stop it with SIGTERM (kill PID) or --duration")
    assert (notice in stderr) == (ignored == signal.SIGINT), stderr
    assert read_bag(tmp_path / "bag") == []


def test_recording_every_topic_leaves_out_an_action_s_hidden_topics(ros_env, tmp_path):
    """With no topic named, oxygen-record records every topic but the hidden ones, as ``ros2 bag
    record -a`` does: an Ask action server's ``_action/feedback`` and ``_action/status`` are the
    action's own bookkeeping, not data to play back."""
    from std_msgs.msg import String

    from oxygen_ros.action import Ask
    from oxygen_ros.ros.qos import DATA_QOS

    prefix = unique_prefix()
    out = tmp_path / "bag"
    with Ros() as ros:
        from rclpy.action import ActionServer

        node = ros.node("oxygen_test_asked")
        ActionServer(node, Ask, f"{prefix}/ask", lambda goal: Ask.Result(text="yes", finish_reason="eos"))
        chatter = node.create_publisher(String, f"{prefix}/chatter", DATA_QOS)
        timer = node.create_timer(0.1, lambda: chatter.publish(String(data="hello")))
        proc = _recorder(out, "--duration", "4")
        stdout, stderr = proc.communicate(timeout=60)
        timer.cancel()
    assert proc.returncode == 0, stderr
    reader = open_bag(out)
    try:
        recorded = set(bag_topics(reader))
    finally:
        reader.close()
    assert f"{prefix}/chatter" in recorded, (recorded, stderr[-2000:])  # the same node's plain topic is recorded
    assert not [t for t in recorded if "/_action/" in t], recorded


def test_topics_are_found_on_steady_time_whatever_the_node_s_ros_clock_does(stepped_ros, tmp_path):
    """A topic that appears after the recorder started is found although its node's ROS clock
    stands still (use_sim_time with no /clock; on wall time, the system clock stepped back)."""
    import rclpy
    from std_msgs.msg import String

    from oxygen_ros.ros.bags import BagWriter
    from oxygen_ros.tools.record import Recorder

    node = stepped_ros.add(rclpy.create_node("oxygen_test_record", context=stepped_ros.context,
                                             parameter_overrides=params(use_sim_time=True)))
    topic = f"{stepped_ros.prefix}/late"
    bag = BagWriter(tmp_path / "out", "mcap")
    try:
        recorder = Recorder(node, bag, [topic])
        assert recorder.last_found is None
        stepped_ros.node("oxygen_test_late_publisher").create_publisher(String, topic, 10)
        assert stepped_ros.spin_until(lambda: recorder.last_found is not None, timeout=10.0), "the topic was not found"
    finally:
        bag.close()


def test_a_topic_found_late_gets_the_whole_duration_from_its_first_message():
    from oxygen_ros.tools.record import end_time

    assert end_time(None, 100.0, 101.0, 102.0) is None  # no --duration: until a signal
    assert end_time(2.0, 100.0, None, None) == 102.0  # nothing found: the duration from the start
    assert end_time(2.0, 100.0, 103.5, None) == 105.5  # found after the duration had passed: it waits
    assert end_time(2.0, 100.0, 103.5, 104.0) == 106.0  # then records 2 s from its first message


def test_the_duration_counts_from_the_first_message_and_ends_a_silent_recording(ros_env, tmp_path):
    """A publisher that starts 1 s after the recorder still gets its 4 s recorded (discovery took
    2.6 s under the whole suite, and a topic found late gets the whole duration to say
    something); a recording that gets nothing ends after the duration all the same, saying so."""
    from std_msgs.msg import String

    prefix = unique_prefix()
    silent = _recorder(tmp_path / "silent", f"{prefix}/nothing", "--duration", "1")
    _, stderr = silent.communicate(timeout=30)
    assert silent.returncode == 1 and "nothing received" in stderr
    proc = _recorder(tmp_path / "late", f"{prefix}/late", "--duration", "4")
    time.sleep(1.0)
    with Ros() as ros:
        pub = ros.node("oxygen_test_late_publisher").create_publisher(String, f"{prefix}/late", 10)
        published_from = time.time()
        while proc.poll() is None:
            pub.publish(String(data="x"))
            time.sleep(0.05)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, (f"published from {published_from:.3f} to {time.time():.3f}", stderr)
    messages = read_bag(tmp_path / "late")
    span = (messages[-1][2] - messages[0][2]) / 1e9
    assert len(messages) >= 40 and 3.5 < span < 4.6, (len(messages), span)  # 4 s from the first message


def test_options_go_anywhere_among_the_topics(tmp_path):
    """``oxygen-record my_bag --duration 5 /camera/image_raw`` was refused ('unrecognized arguments')."""
    from oxygen_ros.tools.record import parse_args

    args = parse_args([str(tmp_path / "bag"), "--duration", "5", "/camera/image_raw", "--storage", "sqlite3",
                       "/joint_states"])
    assert args.topics == ["/camera/image_raw", "/joint_states"] and args.duration == 5.0
    assert args.storage == "sqlite3"


def test_a_recording_killed_outright_keeps_its_closed_segments(ros_env, tmp_path):
    """SIGKILL (out of memory, a power cut) gave an unreadable bag: 'File end magic is invalid',
    no metadata.yaml, or with sqlite3 no row. Now only the segment being written is lost."""
    from std_msgs.msg import String

    prefix = unique_prefix()
    out = tmp_path / "bag"
    with Ros() as ros:
        node = ros.node("oxygen_test_record_source")
        pub = node.create_publisher(String, f"{prefix}/data", 10)
        sent = []
        node.create_timer(0.05, lambda: (sent.append(len(sent)), pub.publish(String(data=str(len(sent) - 1)))))
        proc = _recorder(out, f"{prefix}/data", "--segment-s", "1")
        try:
            assert ros.wait_until(lambda: len(list(out.glob("bag_2.*"))) == 1, 60.0), proc.poll()  # 2 closed
        finally:
            proc.kill()
            proc.communicate(timeout=30)
    back = [int(m.data) for _, m, _ in read_bag(out)]
    assert len(back) >= 20 and back == list(range(back[0], back[0] + len(back)))  # whole seconds, in order

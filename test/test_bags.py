"""Tests of oxygen_ros.ros.bags: writing and reading rosbag2 bags (MCAP and SQLite3)."""

import numpy as np
import pytest
from message_builders import RECORDED_T0 as T0
from message_builders import bag_recording, bag_with_old_text_tokens

STORAGES = ["mcap", "sqlite3"]


def _topics(path) -> dict:
    """The bag's topics (``bag_topics``) of the bag at ``path``."""
    from oxygen_ros.ros.bags import bag_topics, open_bag

    reader = open_bag(path)
    try:
        return bag_topics(reader)
    finally:
        reader.close()


@pytest.mark.parametrize("storage", STORAGES)
def test_write_then_read_is_equal(tmp_path, storage):
    from oxygen_ros.core.observation import Observation
    from oxygen_ros.ros.bags import read_bag, write_bag
    from oxygen_ros.ros.conversions import action_chunk_msg, observation_to_msg

    messages = bag_recording(images=3)
    obs = Observation(images={"base": np.zeros((4, 4, 3), np.uint8)}, instruction="x", state=np.ones(2, np.float32))
    messages.append(("/oxygen/observation", observation_to_msg(obs, 5), T0 + 10**9))
    messages.append(("/oxygen/actions", action_chunk_msg(1.0, 1, 5, 0.5, 0, 0.125, np.ones((3, 2))), T0 + 2 * 10**9))

    path = write_bag(tmp_path / "bag", storage, messages, latched_topics=["/oxygen/instruction"])
    assert (path / "metadata.yaml").is_file()
    assert next(path.glob("*.mcap" if storage == "mcap" else "*.db3")).is_file()
    back = read_bag(path)
    assert [(t, s) for t, _, s in back] == [(t, s) for t, _, s in messages]
    assert [m for _, m, _ in back] == [m for _, m, _ in messages]

    topics = _topics(path)
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
    (tmp_path / "folder").mkdir()  # the wrong folder: said so, not "Expected metadata file ... does not exist"
    with pytest.raises(BagError, match="folder without the metadata.yaml of a rosbag2 bag: not a bag, or a "
                                       "recording that never wrote one"):
        read_bag(tmp_path / "folder")
    (tmp_path / "b" / "metadata.yaml").unlink()  # a storage file alone: named, and readable by its own path
    (mcap,) = (tmp_path / "b").glob("*.mcap")
    with pytest.raises(BagError, match=f"it holds {mcap.name}: give a file's path to open it alone"):
        read_bag(tmp_path / "b")
    assert [m.data for _, m, _ in read_bag(mcap)] == ["1"]
    with pytest.raises(BagError, match="not a ROS message"):
        write_bag(tmp_path / "c", "mcap", [("/x", "a string", 1)])
    from std_msgs.msg import Int32

    with pytest.raises(BagError, match="carries"):
        write_bag(tmp_path / "d", "sqlite3", [("/x", String(data="1"), 1), ("/x", Int32(data=1), 2)])


@pytest.mark.parametrize("storage", STORAGES)
def test_a_topic_recorded_from_two_publishers_counts_both(tmp_path, storage):
    """A topic that ``ros2 bag record`` stored as two connections (two publishers offering
    different QoS: here one latched, one not) is one topic of the bag whose count is all
    its messages, latched because one connection was."""
    from rclpy.serialization import serialize_message
    from rosbags.rosbag2 import Writer
    from std_msgs.msg import String

    from oxygen_ros.ros import bags

    store = bags.typestore()
    writer = Writer(tmp_path / "bag", version=bags.BAG_VERSION, storage_plugin=bags.STORAGES[storage])
    writer.open()
    latched = writer.add_connection("/oxygen/instruction", "std_msgs/msg/String", typestore=store,
                                    offered_qos_profiles=[bags.latched_qos()])
    plain = writer.add_connection("/oxygen/instruction", "std_msgs/msg/String", typestore=store,
                                  offered_qos_profiles=[])
    for i, conn in enumerate([latched, plain, plain, latched, plain]):
        writer.write(conn, T0 + i, serialize_message(String(data=f"go {i}")))
    writer.close()

    reader = bags.open_bag(tmp_path / "bag")
    try:
        assert len(reader.connections) == 2
        topics = bags.bag_topics(reader)
    finally:
        reader.close()
    assert list(topics) == ["/oxygen/instruction"]
    assert topics["/oxygen/instruction"].count == 5 and topics["/oxygen/instruction"].latched
    assert [m.data for _, m, _ in bags.read_bag(tmp_path / "bag")] == [f"go {i}" for i in range(5)]


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _segmented(path, storage, clock):
    from rclpy.serialization import serialize_message
    from std_msgs.msg import String

    from oxygen_ros.ros.bag_segments import SegmentedBagWriter

    bag = SegmentedBagWriter(path, storage, segment_s=10.0, now=clock)
    bag.add_topic("/instruction", "std_msgs/msg/String", latched=True)
    bag.write("/instruction", T0, serialize_message(String(data="go")))
    bag.add_topic("/data", "std_msgs/msg/String")

    def write(i):
        clock.t = i * 4.0  # a new segment every third message
        bag.write("/data", T0 + (i + 1) * 10**9, serialize_message(String(data=str(i))))
    return bag, write


@pytest.mark.parametrize("storage", STORAGES)
def test_a_segmented_bag_reads_back_as_one(tmp_path, storage):
    """oxygen-record's bags: one file per segment, each listed as it closes; read as one bag, with
    the latched topic of the first segment still latched."""
    from oxygen_ros.ros.bags import bag_topics, open_bag, read_bag

    bag, write = _segmented(tmp_path / "bag", storage, _Clock())
    for i in range(7):
        write(i)
    bag.close()
    assert bag.segments == 3
    back = read_bag(tmp_path / "bag")
    assert [(t, m.data) for t, m, _ in back] == [("/instruction", "go")] + [("/data", str(i)) for i in range(7)]
    reader = open_bag(tmp_path / "bag")
    try:
        topics = bag_topics(reader)
    finally:
        reader.close()
    assert topics["/instruction"].latched and topics["/data"].count == 7
    assert sorted(p.name for p in (tmp_path / "bag").iterdir()) == sorted(
        ["metadata.yaml"] + [f"bag_{n}.{'mcap' if storage == 'mcap' else 'db3'}" for n in range(3)])


@pytest.mark.parametrize("storage", STORAGES)
def test_a_segmented_bag_left_unclosed_keeps_every_closed_segment(tmp_path, storage):
    """The recorder killed outright (SIGKILL, out of memory): the segment being written is lost,
    the others read back (without segments the whole bag was: an empty or unindexed file)."""
    from oxygen_ros.ros.bags import read_bag

    bag, write = _segmented(tmp_path / "bag", storage, _Clock())
    for i in range(8):
        write(i)  # segments: [go, 0, 1, 2], [3, 4, 5], then 6, 7 in the open one
    assert bag.segments == 2
    back = read_bag(tmp_path / "bag")  # the writer never closed
    assert [m.data for _, m, _ in back] == ["go"] + [str(i) for i in range(6)]


def test_a_topic_recorded_with_another_definition_of_a_type_of_this_package_is_named(tmp_path):
    """A bag recorded by an older oxygen_ros holds TextTokens of the definition before
    observation_seq and observation_stamp: rclpy failed on them with a Fast CDR exception, and
    the whole bag could not be read. The topic is named with both type hashes, and the bag's
    other topics are read when asked for."""
    from std_msgs.msg import String

    from oxygen_ros.ros.bags import BagError, outdated_definition, read_bag, write_bag

    notes = [("/note", String(data=f"n{i}"), T0 + 10 + i) for i in range(3)]
    bag = bag_with_old_text_tokens(tmp_path / "old", notes)
    with pytest.raises(BagError, match=r"topic /oxygen/text was recorded with another definition of "
                                       r"oxygen_ros/msg/TextToken \(type hash RIHS01_.*read_bag\(path, "
                                       r"topics=\['/note'\]\)"):
        read_bag(bag)
    assert [m.data for _, m, _ in read_bag(bag, topics=["/note"])] == ["n0", "n1", "n2"]
    topics = _topics(bag)
    assert topics["/oxygen/text"].outdated and not topics["/note"].outdated
    # a bag recorded today reads, its TextTokens' hash being this package's
    from oxygen_ros.msg import TextToken

    today = write_bag(tmp_path / "new", "mcap", [("/oxygen/text", TextToken(observation_seq=4), T0)])
    assert [m.observation_seq for _, m, _ in read_bag(today)] == [4]
    assert outdated_definition("std_msgs/msg/String", "RIHS01_0") == ""  # the wheels' types are rclpy's

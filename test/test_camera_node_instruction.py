"""The camera node's first group and the instruction, on real DDS: a latched instruction
comes only once its publisher is discovered, often after the cameras' first frames. While a
publisher is on the instruction topic and nothing has come, the first group is held (at most
``instruction_wait_s``), so the robot's first actions follow the task, not
``default_instruction``; with no publisher there, nothing waits."""

import time

from camera_rig import CameraRig, record_log, solid
from ros_harness import camera_node


def _frames(rig):
    frame = solid(8, 8, (40, 80, 120))
    return lambda: (rig.send_raw(frame), rig.send_jpeg(frame))


def test_the_first_group_waits_for_an_instruction_that_comes_after_the_frames(stepped_ros):
    from std_msgs.msg import String

    rig = CameraRig(stepped_ros)
    camera = camera_node(stepped_ros, default_instruction="idle", instruction_wait_s=30.0)
    rig.wait_matched(camera)
    assert stepped_ros.spin_until(lambda: camera.status.waiting_for_instruction >= 3, every=_frames(rig))
    assert rig.observations == [] and camera.instruction is None
    assert camera.diagnostics()["waiting_for_instruction"] >= 3

    rig.instruction.publish(String(data="stack the cups"))  # no frame after it: the group held goes out
    assert stepped_ros.spin_until(lambda: rig.observations, timeout=5.0)
    assert [m.instruction for m in rig.observations] == ["stack the cups"]
    assert [m.seq for m in rig.observations] == [0]

    waiting = camera.status.waiting_for_instruction
    rig.instruction.publish(String(data=""))  # back to the default: later groups are not held for another
    assert stepped_ros.spin_until(lambda: camera.instruction is None)
    assert stepped_ros.spin_until(lambda: len(rig.observations) >= 3, every=_frames(rig))
    assert rig.observations[-1].instruction == "idle"
    assert camera.status.waiting_for_instruction == waiting


def test_with_no_instruction_in_instruction_wait_s_the_group_goes_out_with_the_default(stepped_ros, monkeypatch):
    rig = CameraRig(stepped_ros)  # its latched instruction publisher never publishes
    camera = camera_node(stepped_ros, default_instruction="idle", instruction_wait_s=1.0)
    lines = record_log(camera, monkeypatch)
    rig.wait_matched(camera)
    send = _frames(rig)
    send()
    assert stepped_ros.spin_until(lambda: camera.status.waiting_for_instruction >= 1, every=send)
    held_at = time.monotonic()
    stepped_ros.spin_for(0.2)  # the frames still on their way
    received = list(camera.received)
    assert stepped_ros.spin_until(lambda: rig.observations, timeout=5.0), \
        "the group held was not sent when instruction_wait_s ran out (no frame came after it)"
    assert time.monotonic() - held_at > 0.5, "the group went out before instruction_wait_s (1 s) ran out"
    assert camera.received == received, "a frame came after the hold: the test is not testing the timer"
    assert rig.observations[0].instruction == "idle"
    ran_out = [(level, text) for level, text in lines if "no instruction came" in text]
    assert len(ran_out) == 1 and ran_out[0][0] == "warning", lines
    assert "instruction_wait_s 1" in ran_out[0][1] and "'idle'" in ran_out[0][1]
    held = {level for level, text in lines if "holding the first group" in text}
    assert held == {"info"}, lines

    waiting = camera.status.waiting_for_instruction
    assert stepped_ros.spin_until(lambda: len(rig.observations) >= 4, every=send)
    assert camera.status.waiting_for_instruction == waiting, "a group was held after the first went out"
    assert len([text for _, text in lines if "no instruction came" in text]) == 1


def test_with_no_publisher_on_the_instruction_topic_nothing_waits(stepped_ros):
    rig = CameraRig(stepped_ros)
    camera = camera_node(stepped_ros, default_instruction="idle", instruction_wait_s=30.0,
                         instruction_topic=f"{stepped_ros.prefix}/nobody_publishes_here")
    rig.wait_matched(camera)
    assert stepped_ros.spin_until(lambda: rig.observations, every=_frames(rig))
    assert rig.observations[0].instruction == "idle"
    assert camera.status.waiting_for_instruction == 0



def test_an_empty_instruction_with_no_default_clears_the_task_until_the_next(stepped_ros, monkeypatch):
    """An operator's 'clear the task' (an empty instruction) with default_instruction empty: the
    groups went on with an empty prompt, and the demo's gripper went to a target of the model's
    own choosing (a walkthrough of the language side). No group goes out now, with one warning,
    until an instruction comes; with a default_instruction the empty one means the default."""
    from std_msgs.msg import String

    rig = CameraRig(stepped_ros)
    camera = camera_node(stepped_ros, instruction_wait_s=0.0)
    lines = record_log(camera, monkeypatch)
    rig.wait_matched(camera)
    rig.instruction.publish(String(data="stack the cups"))
    assert stepped_ros.spin_until(lambda: rig.observations, every=_frames(rig))
    rig.instruction.publish(String(data=""))
    assert stepped_ros.spin_until(lambda: camera.instruction is None)
    published, waiting = len(rig.observations), camera.status.waiting_for_instruction
    assert stepped_ros.spin_until(lambda: camera.status.waiting_for_instruction >= waiting + 3, every=_frames(rig))
    stepped_ros.spin_for(0.2)
    assert len(rig.observations) == published, [m.instruction for m in rig.observations[published:]]
    cleared = [(level, text) for level, text in lines if "the task is cleared" in text]
    assert cleared == [("warning", f"empty instruction on {stepped_ros.prefix}/instruction, and default_instruction "
                                   "is empty: the task is cleared, and no observation goes out (the robot gets no "
                                   "new action) until an instruction comes")], lines
    rig.instruction.publish(String(data="wipe the table"))
    assert stepped_ros.spin_until(lambda: len(rig.observations) > published, every=_frames(rig))
    assert {m.instruction for m in rig.observations[published:]} == {"wipe the table"}

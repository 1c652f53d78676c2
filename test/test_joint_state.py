"""StateTracker: the robot state a camera node groups, from JointState messages."""

import math

import numpy as np
import pytest

from oxygen_ros.core.joint_state import StateTracker

S = 1_000_000_000


def test_without_joint_names_each_message_is_the_state_in_its_order():
    t = StateTracker()
    assert t.update(["b", "a"], [1.0, 0.0], 0) is None
    np.testing.assert_array_equal(t.current(0, 1.0), [1.0, 0.0])
    assert t.update([], [0.5], 1) is None  # names are optional without joint names
    np.testing.assert_array_equal(t.current(1, 1.0), [0.5])


def test_joint_names_pick_and_order_joints_from_several_publishers():
    """An arm's driver and a gripper's on one topic: the state is the named joints in the
    named order, complete once both have spoken; other joints and order changes do not matter."""
    t = StateTracker(["j0", "j1", "gripper"])
    assert t.update(["j1", "j0", "wheel"], [1.0, 0.5, 9.0], 0) is None
    assert t.current(0, 1.0) is None
    assert t.missing(0, 1.0) == "no position yet of joint(s) ['gripper']; the messages name ['j1', 'j0', 'wheel']"
    assert t.update(["gripper"], [0.04], 1) is None
    np.testing.assert_allclose(t.current(1, 1.0), [0.5, 1.0, 0.04])
    assert t.update(["j0", "j1"], [0.6, 1.1], 2) is None  # the arm again, the other order
    np.testing.assert_allclose(t.current(2, 1.0), [0.6, 1.1, 0.04])
    assert t.update(["wheel"], [3.0], 3) is None  # none of the named joints: nothing changes
    np.testing.assert_allclose(t.current(3, 1.0), [0.6, 1.1, 0.04])


def test_the_stamp_is_the_newest_taken_message_s_header_stamp_or_its_arrival():
    t = StateTracker()
    assert t.stamp_ns is None
    t.update(["a"], [1.0], 5 * S, stamp_ns=4 * S)
    assert t.stamp_ns == 4 * S
    t.update(["a"], [1.0], 6 * S)  # no header stamp: its arrival
    assert t.stamp_ns == 6 * S
    named = StateTracker(["arm"])
    named.update(["arm"], [0.0], 1 * S, stamp_ns=S // 2)
    named.update(["wheel"], [0.0], 2 * S, stamp_ns=2 * S)  # none of the named joints: not taken
    assert named.stamp_ns == S // 2


def test_an_old_state_is_no_state():
    t = StateTracker()
    t.update(["a"], [1.0], 0)
    assert t.current(S, 1.0) is not None and t.current(S + 1, 1.0) is None
    assert "old (over 1 s)" in t.missing(2 * S, 1.0)
    assert t.missing(S + S // 50, 1.0).startswith("the newest state is 1.02 s old")  # not "1.0 s (over 1 s)"
    assert t.current(100 * S, math.inf) is not None  # no limit
    named = StateTracker(["arm", "gripper"])
    named.update(["arm", "gripper"], [0.0, 0.0], 0)
    named.update(["arm"], [0.1], 2 * S)
    assert named.current(2 * S, 1.0) is None and "['gripper'] older than 1 s" in named.missing(2 * S, 1.0)


@pytest.mark.parametrize("names, positions, reason", [
    ([], [], "state_empty"),
    (["a", "b"], [1.0], "state_names_mismatch"),
    (["a"], [math.nan], "state_not_finite"),
    ([f"j{i}" for i in range(40)], [0.0] * 40, "state_too_long"),
])
def test_a_bad_message_is_refused_and_drops_the_state_held(names, positions, reason):
    t = StateTracker()
    t.update(["a"], [1.0], 0)
    refusal = t.update(names, positions, 1)
    assert refusal is not None and refusal[0] == reason
    assert t.current(1, 1.0) is None  # never the older state instead
    assert t.missing(1, 1.0) == f"the last message was refused: {refusal[1]}"  # not "no valid state yet"
    t.update(["a"], [2.0], 2)
    assert t.missing(2, 1.0) == ""


def test_with_joint_names_only_the_named_joints_must_be_finite_and_names_are_needed():
    t = StateTracker(["a"])
    assert t.update(["a", "other"], [1.0, math.nan], 0) is None
    np.testing.assert_array_equal(t.current(0, 1.0), [1.0])
    assert t.update([], [2.0], 1)[0] == "state_names_mismatch"
    with pytest.raises(ValueError, match="unique"):
        StateTracker(["a", "a"])


def test_with_joint_names_another_driver_s_message_changes_nothing_however_it_is():
    """A conveyor's driver on the arm's topic sends velocities without positions: that refused
    every one of its messages (a warning each) and wiped the arm's state, so no observation went
    out until the arm spoke again. A bad message naming a joint of ours drops that joint only."""
    t = StateTracker(["j0", "gripper"])
    assert t.update(["j0", "gripper"], [0.5, 0.04], 0) is None
    for names, positions in ((["conveyor"], []), (["conveyor", "belt"], [1.0]), (["belt"], [math.nan])):
        assert t.update(names, positions, 1) is None
        np.testing.assert_allclose(t.current(1, 1.0), [0.5, 0.04])
    refusal = t.update(["gripper", "finger"], [0.03], 2)  # the gripper's driver, names and positions disagreeing
    assert refusal is not None and refusal[0] == "state_names_mismatch"
    assert t.current(2, 1.0) is None and t.missing(2, 1.0) == f"the last message was refused: {refusal[1]}"
    assert t.update(["gripper"], [0.02], 3) is None  # the arm's j0 was kept
    np.testing.assert_allclose(t.current(3, 1.0), [0.5, 0.02])


def test_without_joint_names_the_first_message_s_order_is_kept_and_other_joints_are_refused():
    """A driver that sent its joints in another order (a walkthrough: ["y", "x"] for a while) gave
    the state [-1.0, 0.893] for [0.893, -1.0], silently. The first message's names now fix the
    order: the same joints in another order are put back in it, other joints are refused (two
    publishers on the topic), and a message without names is taken as it is."""
    t = StateTracker()
    assert t.order is None
    assert t.update(["x", "y"], [0.5, -1.0], 0) is None and t.order == ("x", "y")
    assert t.update(["y", "x"], [-0.9, 0.4], 1) is None
    np.testing.assert_allclose(t.current(1, 1.0), [0.4, -0.9])
    refusal = t.update(["x", "z"], [0.1, 0.2], 2)
    assert refusal is not None and refusal[0] == "state_names_changed"
    assert refusal[1] == ("JointState names ['x', 'z'], not the joints of the first message ['x', 'y'], whose order "
                          "the state keeps; two publishers on the topic? state_joint_names picks joints by name")
    assert t.current(2, 1.0) is None
    assert t.update([], [0.3, 0.7], 3) is None  # no names: its own order
    np.testing.assert_allclose(t.current(3, 1.0), [0.3, 0.7])
    assert t.update(["x", "y"], [0.2, 0.1], 4) is None and t.order == ("x", "y")
    refusal = t.update(["y", "x", "x"], [0.1, 0.2, 0.3], 5)  # (reordered by name, one would be lost)
    assert refusal == ("state_names_mismatch", "a joint named twice in ['y', 'x', 'x']: which position is whose?")
    assert StateTracker().update(["a", "b", "a"], [1.0, 2.0, 3.0], 0)[0] == "state_names_mismatch"

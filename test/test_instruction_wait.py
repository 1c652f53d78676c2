"""InstructionWait: when the camera node holds its first group for the instruction (no ROS)."""

import pytest

from oxygen_ros.core.instruction_wait import GO, HOLD, RAN_OUT, InstructionWait

S = 1_000_000_000  # ns


def test_the_first_group_is_held_while_a_publisher_is_there_and_goes_out_when_the_instruction_comes():
    wait = InstructionWait(2.0)
    assert wait.check(10 * S, publishers=lambda: 1) == HOLD
    assert wait.check(11 * S, publishers=lambda: 1) == HOLD  # a newer group, still within 2 s of the first hold
    assert wait.arrived(), "a group was held: it can go out now"
    assert wait.check(11 * S, publishers=lambda: 1) == GO
    assert wait.check(100 * S, publishers=lambda: 1) == GO


def test_the_wait_runs_out_once_then_nothing_is_held():
    wait = InstructionWait(2.0)
    assert wait.deadline_ns is None
    assert wait.check(10 * S, publishers=lambda: 1) == HOLD
    assert wait.check(12 * S - 1, publishers=lambda: 1) == HOLD
    assert wait.deadline_ns == 12 * S, "the held group is to be checked again when the wait runs out"
    assert wait.check(12 * S, publishers=lambda: 1) == RAN_OUT
    assert wait.deadline_ns is None
    assert wait.check(13 * S, publishers=lambda: 1) == GO
    assert not wait.arrived(), "nothing was held when the late instruction came"


def test_the_publishers_are_not_asked_once_nothing_can_be_held():
    wait = InstructionWait(2.0)
    assert wait.check(0, publishers=lambda: 0) == GO

    def refuse():
        raise AssertionError("asked after the first group went out")

    assert wait.check(S, publishers=refuse) == GO
    assert InstructionWait(0.0).check(0, publishers=refuse) == GO


def test_nothing_is_held_without_a_publisher_with_wait_0_or_once_a_group_went_out():
    assert InstructionWait(2.0).check(0, publishers=lambda: 0) == GO
    assert InstructionWait(0.0).check(0, publishers=lambda: 1) == GO
    wait = InstructionWait(2.0)
    assert wait.check(0, publishers=lambda: 0) == GO
    assert wait.check(S, publishers=lambda: 1) == GO, "a publisher that comes after the first group holds nothing"


def test_an_instruction_before_any_group_means_no_hold():
    wait = InstructionWait(2.0)
    assert not wait.arrived()
    assert wait.check(0, publishers=lambda: 1) == GO


def test_a_clock_stepped_back_ends_the_wait():
    wait = InstructionWait(2.0)
    assert wait.check(10 * S, publishers=lambda: 1) == HOLD
    assert wait.check(5 * S, publishers=lambda: 1) == RAN_OUT


@pytest.mark.parametrize("bad", [-1.0, float("nan")])
def test_a_negative_or_nan_wait_is_refused(bad):
    with pytest.raises(ValueError, match="wait_s"):
        InstructionWait(bad)

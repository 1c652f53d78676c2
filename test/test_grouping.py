"""The camera node's grouping decision, without ROS (oxygen_ros.core.grouping)."""

import pytest

from oxygen_ros.core.grouping import NO_STATE, PUBLISH, STALE, WAIT, FrameGrouping

MS = 1_000_000
MAX_AGE = 0.5  # s


def test_one_camera_publishes_every_new_frame_but_not_a_resent_one():
    g = FrameGrouping(1, needs_state=False)
    assert g.frame_arrived(0, 100 * MS, 101 * MS, MAX_AGE, False).kind == PUBLISH
    g.published()
    assert g.frame_arrived(0, 100 * MS, 150 * MS, MAX_AGE, False).kind == WAIT  # the grouped frame again
    assert g.frame_arrived(0, 200 * MS, 201 * MS, MAX_AGE, False).kind == PUBLISH


def test_every_camera_must_deliver_a_new_frame():
    g = FrameGrouping(2, needs_state=False)
    assert g.frame_arrived(0, 100 * MS, 101 * MS, MAX_AGE, False).kind == WAIT
    assert g.frame_arrived(0, 110 * MS, 111 * MS, MAX_AGE, False).kind == WAIT  # the newest replaces it
    assert g.frame_arrived(1, 105 * MS, 112 * MS, MAX_AGE, False).kind == PUBLISH
    g.published()
    assert g.stamps == [110 * MS, 105 * MS]
    assert g.frame_arrived(1, 205 * MS, 206 * MS, MAX_AGE, False).kind == WAIT


def test_a_stale_group_is_dropped_and_the_stale_camera_must_deliver_again():
    g = FrameGrouping(2, needs_state=False)
    g.frame_arrived(0, 0, 1 * MS, MAX_AGE, False)
    d = g.frame_arrived(1, 700 * MS, 701 * MS, MAX_AGE, False)
    assert d.kind == STALE and d.stale == (0,)
    assert g.frame_arrived(1, 750 * MS, 751 * MS, MAX_AGE, False).kind == WAIT  # camera 0 is not new any more
    assert g.frame_arrived(0, 760 * MS, 761 * MS, MAX_AGE, False).kind == PUBLISH


def test_no_group_without_a_valid_state():
    g = FrameGrouping(1, needs_state=True)
    assert g.frame_arrived(0, 100 * MS, 101 * MS, MAX_AGE, has_state=False).kind == NO_STATE
    assert g.frame_arrived(0, 200 * MS, 201 * MS, MAX_AGE, has_state=True).kind == PUBLISH


def test_at_least_one_camera():
    with pytest.raises(ValueError):
        FrameGrouping(0, needs_state=False)


def test_frames_held_back_for_a_state_go_out_when_a_valid_state_arrives():
    """The camera's first frame after a drop-out (or any frame after a rejected state) came
    while there was no valid state; the camera's state follows right after it. The group
    goes out then, not a camera period later with the next frame."""
    g = FrameGrouping(1, needs_state=True)
    assert g.frame_arrived(0, 100 * MS, 101 * MS, MAX_AGE, has_state=False).kind == NO_STATE
    assert g.state_arrived(102 * MS, MAX_AGE).kind == PUBLISH
    g.published()
    assert g.state_arrived(103 * MS, MAX_AGE).kind == WAIT  # nothing new to group
    assert g.frame_arrived(0, 200 * MS, 201 * MS, MAX_AGE, has_state=True).kind == PUBLISH


def test_a_state_completes_no_group_of_missing_or_stale_frames():
    g = FrameGrouping(2, needs_state=True)
    assert g.state_arrived(1 * MS, MAX_AGE).kind == WAIT  # no frame yet
    g.frame_arrived(0, 100 * MS, 101 * MS, MAX_AGE, has_state=False)
    assert g.state_arrived(102 * MS, MAX_AGE).kind == WAIT  # camera 1 has not delivered
    assert g.frame_arrived(1, 110 * MS, 111 * MS, MAX_AGE, has_state=False).kind == NO_STATE
    d = g.state_arrived(900 * MS, MAX_AGE)  # the state came too late: the frames are too old now
    assert d.kind == STALE and d.stale == (0, 1)
    assert g.state_arrived(901 * MS, MAX_AGE).kind == WAIT

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
    assert g.state_arrived(102 * MS, MAX_AGE, 102 * MS).kind == PUBLISH
    g.published()
    assert g.state_arrived(103 * MS, MAX_AGE, 103 * MS).kind == WAIT  # nothing new to group
    assert g.frame_arrived(0, 200 * MS, 201 * MS, MAX_AGE, has_state=True).kind == PUBLISH


def test_a_group_held_by_the_node_is_decided_again_when_its_instruction_comes():
    """A group ready but not published (held for the instruction) is still ready; once it went
    out there is nothing to group, and frames too old by then are dropped."""
    g = FrameGrouping(1, needs_state=False)
    assert g.frame_arrived(0, 100 * MS, 101 * MS, MAX_AGE, False).kind == PUBLISH  # the node holds it
    assert g.again(150 * MS, MAX_AGE, False).kind == PUBLISH
    g.published()
    assert g.again(160 * MS, MAX_AGE, False).kind == WAIT
    g.frame_arrived(0, 200 * MS, 201 * MS, MAX_AGE, False)  # held again
    assert g.again(800 * MS, MAX_AGE, False).kind == STALE
    g = FrameGrouping(1, needs_state=True)
    assert g.frame_arrived(0, 100 * MS, 101 * MS, MAX_AGE, True).kind == PUBLISH  # held; the state then lost
    assert g.again(150 * MS, MAX_AGE, False).kind == NO_STATE


def test_a_state_completes_no_group_of_missing_or_stale_frames():
    g = FrameGrouping(2, needs_state=True)
    assert g.state_arrived(1 * MS, MAX_AGE, 1 * MS).kind == WAIT  # no frame yet
    g.frame_arrived(0, 100 * MS, 101 * MS, MAX_AGE, has_state=False)
    assert g.state_arrived(102 * MS, MAX_AGE, 102 * MS).kind == WAIT  # camera 1 has not delivered
    assert g.frame_arrived(1, 110 * MS, 111 * MS, MAX_AGE, has_state=False).kind == NO_STATE
    d = g.state_arrived(900 * MS, MAX_AGE, 900 * MS)  # the state came too late: the frames are too old now
    assert d.kind == STALE and d.stale == (0, 1)
    assert g.state_arrived(901 * MS, MAX_AGE, 901 * MS).kind == WAIT


def _run(g: FrameGrouping, events) -> list[tuple[int, ...]]:
    """Feed (camera, stamp_ms) frames, each arriving 1 ms after its stamp; the stamps of every
    published group, in order."""
    groups = []
    for camera, stamp in events:
        if g.frame_arrived(camera, stamp * MS, (stamp + 1) * MS, MAX_AGE, False).kind == PUBLISH:
            groups.append(tuple(s // MS for s in g.stamps))
            g.published()
    return groups


def test_synchronised_cameras_stay_paired_after_the_first_camera_loses_a_frame():
    """Three cameras stamped together at 10 Hz, camera 0's frame always first to arrive. After
    it lost the frame at 300 ms, its 400 ms frame finds the others' 300 ms frames new: the group
    waits for their 400 ms frames instead of pairing each of its frames with the others'
    previous ones, 100 ms apart, for the rest of the run."""
    events = [(c, t) for t in range(0, 1000, 100) for c in range(3) if (c, t) != (0, 300)]
    groups = _run(FrameGrouping(3, needs_state=False), events)
    assert groups == [(t, t, t) for t in range(0, 1000, 100) if t != 300], groups


def test_free_running_cameras_are_paired_within_half_a_period_at_the_full_rate():
    """Two 10 Hz cameras 40 ms out of phase (camera 1's frames 60 ms before camera 0's): each
    group waits at most for the nearer frame, one group per period still goes out."""
    events = sorted([(0, t) for t in range(100, 1100, 100)] + [(1, t + 40) for t in range(0, 1000, 100)],
                    key=lambda e: e[1])
    groups = _run(FrameGrouping(2, needs_state=False), events)
    assert len(groups) == 9, groups  # one per period (the 1000 ms frame waits for a 1040 ms one)
    assert groups[0] == (100, 40)  # no period known yet: never waited for
    assert all(abs(a - b) <= 50 for a, b in groups[1:]), groups


def test_a_camera_is_waited_for_once_per_group():
    """Both cameras lose frames in turn: each is waited for once, then the group goes out with
    the frames there are instead of chasing the next pair."""
    g = FrameGrouping(2, needs_state=False)
    assert _run(g, [(0, 0), (1, 0), (0, 100), (1, 100), (1, 200)]) == [(0, 0), (100, 100)]
    assert g.frame_arrived(0, 300 * MS, 301 * MS, MAX_AGE, False).kind == WAIT  # camera 1's 300 ms is closer
    assert g.frame_arrived(1, 400 * MS, 401 * MS, MAX_AGE, False).kind == WAIT  # it was lost: now camera 0's
    assert g.frame_arrived(0, 500 * MS, 501 * MS, MAX_AGE, False).kind == PUBLISH  # lost too: each waited once
    assert g.spread_ns() == 100 * MS


def test_a_camera_is_waited_for_one_of_its_periods_at_most():
    """Two 10 Hz cameras 60 ms out of phase, and camera 0's next frame does not come (lost, or a
    lockstep bag player holds it until this group's chunk is back): the group waits one period of
    camera 0 for it, then goes out with camera 0's frame there is."""
    g = FrameGrouping(2, needs_state=False)
    assert _run(g, [(0, 0), (1, 60)]) == [(0, 60)]
    assert g.frame_arrived(0, 100 * MS, 101 * MS, MAX_AGE, False).kind == WAIT  # camera 1 has no new frame
    d = g.frame_arrived(1, 160 * MS, 161 * MS, MAX_AGE, False)
    assert d.kind == WAIT and d.retry_ns == 261 * MS, d  # camera 0's 200 ms frame is closer: due by 261 ms
    assert g.again(260 * MS, MAX_AGE, False).kind == WAIT
    assert g.again(d.retry_ns, MAX_AGE, False).kind == PUBLISH
    assert (g.stamps, g.spread_ns()) == ([100 * MS, 160 * MS], 60 * MS)


def test_a_camera_whose_next_frame_is_overdue_is_not_waited_for():
    """Camera 0 stopped 350 ms before camera 1's frame (over one and a half of its periods):
    the group goes out with its last frame, as a group of a stopped camera always did."""
    g = FrameGrouping(2, needs_state=False)
    assert _run(g, [(0, 0), (1, 0), (0, 50), (0, 100), (0, 150), (0, 200), (1, 550)]) == [(0, 0), (200, 550)]


def _camera_then_state(g, k, period=100 * MS, arrival=3 * MS):
    """Tick ``k`` of a driver that publishes its image, then the state taken with it (same stamp):
    the decisions at the image's arrival and at the state's (a group is published when told)."""
    t = k * period
    decisions = (g.frame_arrived(0, t, t + arrival, MAX_AGE, g.state_stamp is not None).kind,)
    if decisions[-1] == PUBLISH:
        g.published()
    decisions += (g.state_arrived(t + arrival + 1, MAX_AGE, t).kind,)
    if decisions[-1] == PUBLISH:
        g.published()
    return decisions


def test_an_image_published_before_its_state_waits_for_that_state_not_the_one_before():
    g = FrameGrouping(1, needs_state=True)
    decisions = [_camera_then_state(g, k) for k in range(6)]
    assert decisions[0] == (NO_STATE, PUBLISH)  # no state yet: the first one completes the group
    # from the second tick on each image waits for its own state (on the second, one state gives no
    # period yet: the camera's stands for it)
    assert decisions[1:] == [(WAIT, PUBLISH)] * 5


def test_until_the_state_has_a_period_a_group_waits_one_camera_period_at_most():
    """A state published once (a slow or stopped driver): the second group waits for a newer one
    one camera period at most, then goes with the state held."""
    g = FrameGrouping(1, needs_state=True)
    assert _camera_then_state(g, 0) == (NO_STATE, PUBLISH)
    d = g.frame_arrived(0, 100 * MS, 103 * MS, MAX_AGE, True)
    assert d.kind == WAIT and d.retry_ns == 203 * MS
    assert g.again(d.retry_ns, MAX_AGE, True).kind == PUBLISH


def test_a_state_that_does_not_come_is_waited_for_one_state_period_then_the_group_goes_with_the_one_held():
    """The driver stopped, or a bag ended, after the image: nothing else arrives, and the node
    decides again at ``retry_ns``."""
    g = FrameGrouping(1, needs_state=True)
    for k in range(3):
        _camera_then_state(g, k)
    d = g.frame_arrived(0, 300 * MS, 303 * MS, MAX_AGE, True)  # tick 3's image; its state never comes
    assert d.kind == WAIT and d.retry_ns == 403 * MS  # one state period (100 ms) after the wait began
    assert g.again(350 * MS, MAX_AGE, True).kind == WAIT
    assert g.again(d.retry_ns, MAX_AGE, True).kind == PUBLISH
    g.published()
    assert g.state_arrived(405 * MS, MAX_AGE, 300 * MS).kind == WAIT  # tick 3's state, late: nothing to group
    d = g.frame_arrived(0, 400 * MS, 406 * MS, MAX_AGE, True)  # the next group waits afresh
    assert d.kind == WAIT and d.retry_ns == 506 * MS


def test_with_state_wait_off_a_group_takes_the_state_held():
    g = FrameGrouping(1, needs_state=True, state_wait=False)
    decisions = [_camera_then_state(g, k) for k in range(6)]
    assert decisions[1:] == [(PUBLISH, WAIT)] * 5


def test_a_state_faster_than_the_camera_is_not_waited_for():
    """A ros2_control broadcaster at 100 Hz beside a 10 Hz camera: the state held is at most
    half its period older than the image, or the image is older than it."""
    g = FrameGrouping(1, needs_state=True)
    for i in range(20):  # states every 10 ms, stamped at their taking
        g.state_arrived(i * 10 * MS, MAX_AGE, i * 10 * MS)
    assert g.frame_arrived(0, 194 * MS, 196 * MS, MAX_AGE, True).kind == PUBLISH  # state 190 ms: 4 ms older
    g.published()
    assert g.frame_arrived(0, 185 * MS, 196 * MS, MAX_AGE, True).kind == PUBLISH  # the image older than the state


def test_a_state_waited_for_is_not_waited_for_beyond_one_and_a_half_periods():
    g = FrameGrouping(2, needs_state=True)
    for i in range(3):  # a 10 Hz state, then it stops
        g.state_arrived(i * 100 * MS, MAX_AGE, i * 100 * MS)
    g.frame_arrived(0, 300 * MS, 301 * MS, MAX_AGE, True)
    assert g.frame_arrived(1, 300 * MS, 302 * MS, MAX_AGE, True).kind == WAIT  # state 100 ms older: its next is due
    assert g.frame_arrived(0, 340 * MS, 341 * MS, MAX_AGE, True).kind == WAIT
    assert g.frame_arrived(0, 360 * MS, 361 * MS, MAX_AGE, True).kind == PUBLISH  # 160 ms: overdue, not awaited


def _replay(g, events):
    """Feed ``events`` (arrival ms, "frame" or "state", stamp ms) in order, deciding again at each
    ``retry_ns`` that comes before the next event (as the node's timer does); the published groups
    as (the time they went out, the newest frame's stamp, the state's stamp), in ms."""
    groups, retry = [], None

    def act(decision, now):
        nonlocal retry
        if decision.kind == PUBLISH:
            groups.append((now / MS, max(g.stamps) / MS, g.state_stamp / MS))
            g.published()
            retry = None
        elif decision.retry_ns is not None:
            retry = decision.retry_ns if retry is None else min(retry, decision.retry_ns)

    for arrival, kind, stamp in events:
        now = round(arrival * MS)
        while retry is not None and retry <= now:
            at, retry = retry, None
            act(g.again(at, MAX_AGE, True), at)
        if kind == "frame":
            act(g.frame_arrived(0, round(stamp * MS), now, MAX_AGE, g.state_stamp is not None), now)
        else:
            act(g.state_arrived(now, MAX_AGE, round(stamp * MS)), now)
    return groups


def test_a_state_slower_than_the_camera_holds_a_group_back_half_a_frame_period_at_most():
    """A 10 Hz state beside a 30 Hz camera, both stamped when taken and arriving 1 ms later:
    every frame still makes its group, each out within half a frame period of its arrival once
    the state's period is known (a group waits only for a state due by then; before, for a
    state at the camera's rate, at most one frame period), and takes the state nearest in time
    it can. (Waiting for any state due within 1.5 of its periods, 6 of the 30 frames were lost:
    a newer frame came while its group waited.)"""
    frame_ms = 100 / 3
    events = sorted([(k * frame_ms + 1, "frame", k * frame_ms) for k in range(30)]
                    + [(k * 100 + 1, "state", k * 100) for k in range(11)])
    groups = _replay(FrameGrouping(1, needs_state=True), events)
    assert len(groups) == 30, groups
    delays = [out - (stamp + 1) for out, stamp, _ in groups]
    assert max(delays) <= frame_ms, delays
    assert max(delays[3:]) <= frame_ms / 2, [(round(d, 1), g) for d, g in zip(delays, groups)]  # from 100 ms on
    assert [state for _, stamp, state in groups if stamp == 300] == [300]  # a state of its moment, waited for

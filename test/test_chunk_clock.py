"""The chunk clock: which row of the newest chunk each control tick publishes (no ROS)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oxygen_ros.core.chunk_clock import Chunk, ChunkClock, chunk_origin, period_ns, recovery_ticks, unusable_stamp

P = 20_000_000  # 50 Hz


def _chunk(h=10, origin=None, frame=1, stamp=0, ready=0, period=P):
    a = np.arange(h * 2, dtype=np.float32).reshape(h, 2)
    return Chunk(a, period, origin, frame_id=frame, observation_seq=frame, observation_stamp_ns=stamp, ready_ns=ready)


def test_period_ns():
    assert period_ns(50) == 20_000_000
    assert period_ns(3) == 333_333_333
    with pytest.raises(ValueError):
        period_ns(0)


def test_waiting_then_anchored_chunk_publishes_every_row_once():
    clock = ChunkClock()
    t0 = 1_000 * P + 7
    assert clock.tick(t0) is None and clock.waiting == 1 and clock.underruns == 0
    clock.push(_chunk(h=4))
    dues = [clock.tick(t0 + i * P) for i in range(1, 7)]
    assert [d.offset for d in dues[:4]] == [0, 1, 2, 3]
    assert [d.first for d in dues[:4]] == [True, False, False, False]
    assert [d.stamp_ns for d in dues[:4]] == [t0 + i * P for i in range(1, 5)]
    assert dues[0].actions.shape == (4, 2) and dues[3].actions.shape == (1, 2)
    np.testing.assert_array_equal(dues[2].actions, _chunk(h=4).actions[2:])
    assert dues[4] is None and dues[5] is None
    assert clock.underruns == 2 and clock.published == 4 and clock.ticks == 7


def test_observation_origin_skips_the_rows_already_past():
    clock = ChunkClock()
    stamp = 5_000 * P + 3_000_000  # phase 3 ms into a period
    clock.push(_chunk(h=10, origin=stamp, stamp=stamp))
    due = clock.tick(stamp + 2 * P + 19_000_000)  # 59 ms after capture
    assert due.offset == 2 and due.stamp_ns == stamp + 2 * P
    assert due.stamp_ns <= stamp + 2 * P + 19_000_000 < due.stamp_ns + P
    assert clock.skipped_rows == 2
    assert clock.tick(stamp + 3 * P + 19_000_000).offset == 3


def test_tick_before_origin_publishes_row_zero_stamped_in_the_future():
    clock = ChunkClock()
    clock.push(_chunk(origin=10 * P))
    due = clock.tick(10 * P - 5)
    assert due.offset == 0 and due.stamp_ns == 10 * P


def test_a_clock_set_back_never_sends_an_earlier_row_again():
    clock = ChunkClock()
    clock.push(_chunk(h=10, origin=100 * P))
    assert [clock.tick((100 + i) * P).offset for i in range(4)] == [0, 1, 2, 3]
    # the clock goes back 3 periods (a simulation restarted): row 3 is held, then it goes on
    assert [clock.tick((100 + i) * P).offset for i in (1, 2, 3, 4, 5)] == [3, 3, 3, 4, 5]


def test_newer_chunk_replaces_older_one():
    clock = ChunkClock()
    clock.push(_chunk(frame=1))
    assert clock.tick(0).chunk.frame_id == 1
    assert clock.tick(P).offset == 1
    clock.push(_chunk(frame=2))
    due = clock.tick(2 * P)
    assert due.chunk.frame_id == 2 and due.offset == 0 and due.first


def test_chunk_whose_rows_are_all_past_is_an_underrun():
    clock = ChunkClock()
    clock.push(_chunk(h=3, origin=0))
    assert clock.tick(3 * P) is None and clock.underruns == 1


def test_chunk_origin_rules():
    kw = dict(period_ns=P, horizon=10)
    assert chunk_origin("frame_end", stamp_ns=100, received_ns=200, **kw) is None
    assert chunk_origin("observation", stamp_ns=0, received_ns=200, **kw) is None  # no stamp
    assert chunk_origin("observation", stamp_ns=10**12, received_ns=10**12 + 5 * P, **kw) == 10**12
    # arrived after its whole chunk was due: a stamp on another clock (e.g. a replayed bag)
    assert chunk_origin("observation", stamp_ns=10**12, received_ns=10**12 + 10 * P, **kw) is None
    # from the future by more than a period
    assert chunk_origin("observation", stamp_ns=10**12 + 2 * P, received_ns=10**12, **kw) is None
    with pytest.raises(ValueError, match="origin"):
        chunk_origin("bogus", stamp_ns=1, received_ns=1, **kw)


def test_an_unusable_stamp_says_why():
    """What the node logs when a chunk starts at the frame's end in place of its observation's stamp."""
    kw = dict(period_ns=P, horizon=10)
    t = 10**12
    assert unusable_stamp(stamp_ns=t, received_ns=t + 5 * P, **kw) is None
    assert unusable_stamp(stamp_ns=0, received_ns=t, **kw) == "it has no stamp"
    assert unusable_stamp(stamp_ns=t, received_ns=t + 12 * P, **kw) == (
        f"it arrived {12 * P / 1e6:.0f} ms after its stamp, when all 10 actions of its chunk "
        f"({10 * P / 1e6:.0f} ms) were due already")
    assert "later than its arrival (not on this node's clock?)" in unusable_stamp(stamp_ns=t + 3 * P, received_ns=t,
                                                                                   **kw)


def test_first_publications_and_recovery_ticks():
    """The tick that first publishes each chunk is kept with its observation stamp; the
    recovery after a camera frame counts the ticks up to the first chunk from it or later."""
    clock = ChunkClock()
    t0 = 1_000 * P
    clock.push(_chunk(origin=t0, frame=1, stamp=t0))
    for i in range(12):  # row 0 at t0; an underrun from t0 + 10 P on
        clock.tick(t0 + i * P)
    assert list(clock.first_ticks) == [(t0, t0)]
    frame = t0 + 11 * P + P // 2  # a camera frame half a period after a tick
    assert recovery_ticks(frame, clock.first_ticks, P) is None  # no chunk from it yet
    clock.push(_chunk(origin=frame, frame=2, stamp=frame))
    clock.tick(t0 + 12 * P)  # the frame's chunk goes out on the next tick
    assert clock.first_ticks[-1] == (frame, t0 + 12 * P)
    assert recovery_ticks(frame, clock.first_ticks, P) == 1
    assert recovery_ticks(frame - 3 * P, clock.first_ticks, P) == 4  # an earlier frame that made no chunk


def test_age():
    """The age is now minus the observation's stamp, as the message's stamps give it, also for a
    chunk that starts at its frame's end because its observation came too late: the age said
    29 ms (from the frame's end) for a chunk from a 326 ms old image (a walkthrough). A stamp not
    on this clock (the frame worker says which: later than its arrival, or too old without
    max_observation_age to vouch for it) gives the age from the frame's end, as does none."""
    clock = ChunkClock()
    assert clock.age_ns(5) is None
    clock.push(_chunk(origin=100, stamp=100, ready=150))
    assert clock.age_ns(400) == 300
    clock.push(_chunk(origin=None, stamp=100, ready=150))  # too late to compensate: still its stamp's age
    assert clock.age_ns(400) == 300
    clock.push(Chunk(np.zeros((10, 2)), P, None, observation_stamp_ns=100, ready_ns=150, stamp_on_clock=False))
    assert clock.age_ns(400) == 250  # a bag's recorded stamp, a camera's own clock: not days old
    clock.push(_chunk(origin=None, stamp=0, ready=150))  # no stamp
    assert clock.age_ns(400) == 250


def test_bad_chunks_are_refused():
    with pytest.raises(ValueError):
        Chunk(np.zeros((0, 2)), P, None)
    with pytest.raises(ValueError):
        Chunk(np.zeros(3), P, None)
    with pytest.raises(ValueError):
        Chunk(np.zeros((3, 2)), 0, None)


@settings(max_examples=200, deadline=None)
@given(
    origin=st.integers(0, 10**15),
    phase=st.integers(0, P - 1),
    horizon=st.integers(1, 60),
    start=st.integers(0, 80),
    ticks=st.integers(1, 80),
)
def test_consecutive_ticks_advance_by_exactly_one_row(origin, phase, horizon, start, ticks):
    """On a fixed tick grid, each tick publishes the row after the previous
    tick's, its stamp is within one period before the tick, and the chunk runs
    out exactly when its last row's period is over."""
    clock = ChunkClock()
    clock.push(_chunk(h=horizon, origin=origin))
    t_first = origin + phase + start * P
    prev = None
    for i in range(ticks):
        t = t_first + i * P
        due = clock.tick(t)
        expected = (t - origin) // P
        if expected >= horizon:
            assert due is None
            continue
        assert due.offset == expected
        assert due.stamp_ns <= t < due.stamp_ns + P
        assert len(due.actions) == horizon - expected
        if prev is not None:
            assert due.offset == prev + 1
        prev = due.offset
    assert clock.published + clock.underruns == ticks


def test_capture_to_action_is_the_median_delay_from_stamp_to_first_tick_of_the_last_chunks():
    """Of the last chunks' first publications, the median delay from the observation's stamp, counting
    only delays within a chunk's span: a stamp on another clock (a camera's own, a bag's recorded
    ones: days behind, or later than the tick) is not a delay."""
    from oxygen_ros.core.chunk_clock import capture_to_action_ms

    span = 10 * P
    assert capture_to_action_ms([], span) != capture_to_action_ms([], span)  # NaN: no chunk yet
    assert capture_to_action_ms([(0, 5 * P)], span) != capture_to_action_ms([], span)  # none with a stamp
    firsts = [(t * P, t * P + d * 1_000_000) for t, d in ((10, 30), (20, 50), (30, 40), (40, 60), (50, 70))]
    assert capture_to_action_ms(firsts, span, last=3) == 60.0  # the last three: 40, 60, 70 ms
    assert capture_to_action_ms(firsts, span) == 50.0  # all five
    off_clock = [(1_000 * P, 1_000 * P + 86_400 * 10**9), (500 * P, 400 * P), (60 * P, 60 * P + span)]
    assert capture_to_action_ms(firsts + off_clock, span, last=8) == 50.0  # a day behind, ahead, a span late
    clock = ChunkClock()
    clock.push(_chunk(origin=100 * P, stamp=100 * P, ready=103 * P))
    clock.tick(104 * P)
    assert capture_to_action_ms(clock.first_ticks, span) == 4 * P / 1e6

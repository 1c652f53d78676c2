"""TickGuard: a frame steps aside for a control tick that its next piece would hold back."""

import threading
import time

import numpy as np
import pytest

from oxygen_ros.core.engine import Engine, EngineConfig, Question
from oxygen_ros.core.observation import Observation
from oxygen_ros.core.sim.scene import render, sample_scene
from oxygen_ros.core.tick_guard import TickGuard
from oxygen_ros.core.tokenizer import Tokenizer

MS = 1_000_000


class FakeClock:
    def __init__(self):
        self.now = 0

    def __call__(self):
        return self.now


def test_a_piece_that_would_hold_the_tick_back_waits_until_the_tick_is_served():
    clock = FakeClock()
    guard = TickGuard(tolerance_ms=0.5, clock=clock)
    guard.tick_served(next_due_ns=1 * MS)  # the next tick is due in 1 ms; a prefill takes ~3 ms
    events = []

    def worker():
        guard.pause_point("prefill")
        events.append("prefill started")

    t = threading.Thread(target=worker)
    t.start()
    time.sleep(0.2)
    events.append("tick served")
    guard.tick_served(next_due_ns=21 * MS)
    t.join(5.0)
    assert not t.is_alive()
    assert events == ["tick served", "prefill started"]
    assert guard.pauses == 1


def test_a_piece_that_ends_well_before_the_tick_does_not_wait():
    clock = FakeClock()
    guard = TickGuard(tolerance_ms=0.5, clock=clock)
    guard.tick_served(next_due_ns=10 * MS)
    for work in ("prefill", "denoise", "decode"):  # 3 ms, 1 ms, 1 ms: all end before 10 ms
        guard.pause_point(work)
    assert guard.pauses == 0
    clock.now = 9_800_000  # 0.2 ms before the tick: a 1 ms denoise step would hold it back 0.8 ms
    threading.Timer(0.1, guard.tick_served, args=(30 * MS,)).start()
    guard.pause_point("denoise")
    assert guard.pauses == 1


@pytest.mark.parametrize("start_ns, pauses", [(9_300_000, 0), (9_600_000, 1)])
def test_a_piece_may_end_up_to_the_tolerance_after_the_tick_without_a_pause(start_ns, pauses):
    """With ``tick_guard_tolerance_ms`` 0.5, a 1 ms denoise step that would end 0.3 ms after the
    tick is due runs at once (the frame is not slowed for a tick 0.3 ms late); one that would
    end 0.6 ms after it waits for the tick first."""
    clock = FakeClock()
    guard = TickGuard(tolerance_ms=0.5, clock=clock)
    guard.tick_served(next_due_ns=10 * MS)
    clock.now = start_ns  # a denoise step takes 1 ms (the first guess): it would end at start + 1 ms
    tick = threading.Timer(0.05, guard.tick_served, args=(30 * MS,))  # ends a pause, if one is made
    tick.start()
    guard.pause_point("denoise")
    tick.join()
    assert guard.pauses == pauses


def test_without_ticks_the_worker_is_never_held_longer_than_max_wait():
    guard = TickGuard(max_wait_ms=20.0)
    guard.tick_served(next_due_ns=time.monotonic_ns() - MS)  # overdue: the timer has stopped (shutdown)
    start = time.monotonic()
    for _ in range(50):
        guard.pause_point("denoise")
    assert time.monotonic() - start < 2.0, "the frame stalled waiting for ticks that never come"
    assert guard.pauses >= 1


def test_piece_lengths_are_learnt_from_the_frames():
    clock = FakeClock()
    guard = TickGuard(clock=clock)
    for _ in range(40):  # prefill takes 8 ms here, denoise steps 2 ms
        guard.pause_point("prefill")
        clock.now += 8 * MS
        guard.pause_point("denoise")
        clock.now += 2 * MS
        guard.frame_done()
    assert guard.work_ms["prefill"] == pytest.approx(8.0, rel=0.01)
    assert guard.work_ms["denoise"] == pytest.approx(2.0, rel=0.01)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="tolerance_ms"):
        TickGuard(tolerance_ms=-1)
    with pytest.raises(ValueError, match="max_wait_ms"):
        TickGuard(max_wait_ms=0)


def test_the_engine_offers_a_pause_point_before_every_piece_and_the_result_is_unchanged(lively_tiny):
    tok = Tokenizer.default()
    rng = np.random.default_rng(3)
    scene = sample_scene(rng)
    obs = Observation({"base": render(scene, 32)}, scene.instruction, scene.state)
    config = EngineConfig(setting="oxygen", steps_per_frame=4, max_decode=12)

    def frames(pause_point):
        engine = Engine(lively_tiny, tok, config)
        engine.pause_point = pause_point
        return [engine.step([obs], [Question("what is here?", client_id="c")]), engine.step([obs])]

    calls = []
    with_points = frames(calls.append)
    plain = frames(None)
    first = with_points[0]
    steps = lively_tiny.config.denoise_steps
    assert calls[0] == "prefill"
    assert calls[1:1 + steps] == ["denoise"] * steps
    assert calls[1 + steps:1 + steps + len(first.batch_sizes)] == ["decode"] * len(first.batch_sizes)
    assert set(calls) == {"prefill", "denoise", "decode"}
    for a, b in zip(with_points, plain):  # pausing changes nothing the frame produces
        np.testing.assert_array_equal(a.actions[0], b.actions[0])
        assert [(e.request_id, e.token_id) for e in a.tokens] == [(e.request_id, e.token_id) for e in b.tokens]


def test_two_threads_pieces_are_timed_each_on_its_own():
    """``parallel`` runs actions and language on two threads: a piece's length is the time
    until its own thread's next piece, not the other thread's."""
    clock = FakeClock()
    guard = TickGuard(clock=clock)
    start = dict(guard.work_ms)

    steps = [(0, "actions", "prefill"), (1, "language", "decode"), (3, "actions", "denoise"),
             (5, "language", "decode")]
    gates = {name: threading.Event() for name in ("actions", "language")}
    done = {name: threading.Event() for name in ("actions", "language")}
    plan = {name: [(ms, work) for ms, who, work in steps if who == name] for name in gates}

    def thread(name):
        for ms, work in plan[name]:
            gates[name].wait()
            gates[name].clear()
            guard.pause_point(work)
            done[name].set()

    threads = [threading.Thread(target=thread, args=(n,)) for n in gates]
    for t in threads:
        t.start()
    for ms, who, work in steps:  # one step at a time, in this order, at these times
        clock.now = ms * MS
        done[who].clear()
        gates[who].set()
        assert done[who].wait(5.0)
    for t in threads:
        t.join(5.0)
    # the prefill ran 0..3 ms on its thread (the language thread's decode at 1 ms is not its end)
    assert guard.work_ms["prefill"] == pytest.approx(start["prefill"] + 0.2 * (3.0 - start["prefill"]))
    # the first decode ran 1..5 ms on the other
    assert guard.work_ms["decode"] == pytest.approx(start["decode"] + 0.2 * (4.0 - start["decode"]))
    clock.now = 6 * MS
    guard.frame_done()  # both threads' last pieces end with the frame
    assert guard.work_ms["denoise"] == pytest.approx(start["denoise"] + 0.2 * (3.0 - start["denoise"]))

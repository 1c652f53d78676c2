"""TickProbe: a thread of the frame worker's process that ticks and records how late it ran."""

import time

import numpy as np
import pytest

from oxygen_ros.core.tick_guard import TickGuard
from oxygen_ros.core.tick_probe import TickProbe, frames_beside_ticks, lateness_summary


def _hold_the_lock(ms: float) -> float:
    """Run one C loop that never lets go of the interpreter lock for about ``ms``; its length (ms)."""
    t0 = time.perf_counter()
    sum(range(1_000_000))
    n = int(1_000_000 * ms / max((time.perf_counter() - t0) * 1e3, 1e-3))
    t0 = time.perf_counter()
    sum(range(n))  # one call: no switch inside it
    return (time.perf_counter() - t0) * 1e3


def test_a_call_that_holds_the_interpreter_lock_makes_the_ticks_late():
    probe = TickProbe(period_s=0.002).start()
    time.sleep(0.05)
    held = _hold_the_lock(80)
    time.sleep(0.05)
    late = probe.stop()
    assert len(late) > 10
    # the tick due during the hold ran after it: late by most of the hold
    assert late.max() >= 0.5 * held
    assert held >= 20  # the hold was long enough to mean something


def test_a_tick_periods_late_skips_them_as_a_timer_does():
    """A stall of several periods (8 of 10 ms): the periods missed are skipped and counted, as
    rcl's timer does, not run after it as a burst of ever less late ticks."""
    probe = TickProbe(period_s=0.010).start()
    time.sleep(0.05)
    held = _hold_the_lock(80)
    time.sleep(0.05)
    late = probe.stop()
    assert held >= 40
    worst = int(np.argmax(late))
    assert probe.missed >= 3
    assert late[worst + 1] < 10.0, late[worst:worst + 5]  # the next tick is on the grid again


def test_the_probe_tells_the_guard_of_each_tick_so_a_frame_steps_aside_and_goes_on():
    guard = TickGuard()
    pieces = []

    def frame():  # a piece expected to take 3 ms (the guard's first guess for a prefill) before a 2 ms tick
        guard.pause_point("prefill")
        pieces.append(time.perf_counter())

    late, frames_ms, _ = frames_beside_ticks(frame, 0.3, period_s=0.002, rest_s=0.001, guard=guard)
    assert guard.pauses > 0  # without the probe's ticks the guard never knows one is due
    assert len(pieces) == len(frames_ms) > 10  # every pause ended when a tick was served
    assert len(late) > 50


def test_lateness_summary():
    s = lateness_summary(np.array([0.1, 0.2, 3.0, 0.1]), over_ms=2.0, missed=1)
    assert s["ticks"] == 4 and s["late_max_ms"] == 3.0 and s["share_over"] == 0.25 and s["missed"] == 1
    assert s["late_p50_ms"] == pytest.approx(0.15)
    tail = lateness_summary(np.arange(100.0))  # ticks 0, 1, ..., 99 ms late
    assert tail["late_p99_ms"] == pytest.approx(np.percentile(np.arange(100.0), 99)) == pytest.approx(98.01)
    assert tail["late_p50_ms"] == pytest.approx(49.5) and tail["late_max_ms"] == 99.0
    with pytest.raises(ValueError, match="no tick"):
        lateness_summary(np.array([]))
    with pytest.raises(ValueError, match="period_s"):
        TickProbe(period_s=0)

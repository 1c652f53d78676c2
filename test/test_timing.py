"""The benchmarks' timer (oxygen_ros.core.timing) on a fake clock: what ``oxygen-bench`` reports."""

import types

import pytest

from oxygen_ros.core import timing


@pytest.fixture
def clock(monkeypatch):
    """The timer's clock, in seconds, moved only by the calls timed (``advance``)."""
    now = types.SimpleNamespace(t=100.0)
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: now.t))

    def advance(ms):
        now.t += ms / 1e3

    return advance


def test_median_ms_is_the_median_of_the_timed_calls_after_untimed_warm_up(clock):
    """A call that takes 1, 9 and 2 ms is reported as 2 ms (the median: not the fastest, not
    the mean); the warm-up calls before them (a slow first run) are made but not timed."""
    durations = iter([500, 400, 1, 9, 2])  # two warm-up calls, then three timed ones
    calls = []

    def call():
        calls.append(1)
        clock(next(durations))

    assert timing.median_ms(call, repeats=3, warmup=2) == pytest.approx(2.0)
    assert len(calls) == 5


def test_elapsed_s_times_one_call(clock):
    assert timing.elapsed_s(lambda: clock(7)) == pytest.approx(0.007)

"""Rolling statistics used by the inference node's diagnostics (no ROS)."""

import math
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oxygen_ros.core.stats import Rolling, WindowRate, action_frequency, percentile


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50), st.floats(0, 100))
def test_percentile_matches_numpy(values, q):
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-9, abs=1e-6)


def test_percentile_edges():
    assert math.isnan(percentile([], 50))
    assert percentile([3.0], 99) == 3.0
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_rolling_keeps_the_last_samples():
    r = Rolling(maxlen=3)
    assert math.isnan(r.mean()) and math.isnan(r.last) and len(r) == 0
    for v in (1, 2, 3, 4):
        r.add(v)
    assert r.values() == [2, 3, 4] and r.total == 4 and r.last == 4
    assert r.mean() == 3 and r.percentile(50) == 3 and r.min() == 2 and r.max() == 4
    with pytest.raises(ValueError):
        Rolling(0)


def test_rolling_is_safe_across_threads():
    r = Rolling(maxlen=100_000)
    threads = [threading.Thread(target=lambda: [r.add(1.0) for _ in range(5000)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert r.total == 20_000 and len(r) == 20_000


def test_window_rate():
    w = WindowRate(window_s=2.0)
    assert w.rate(0.0) == 0.0
    w.add(10.0, 5)
    assert w.rate(10.0) == 0.0  # no time elapsed yet
    w.add(11.0, 5)
    assert w.rate(11.0) == pytest.approx(5.0)  # 5 events in (10, 11]: the first ones start the meter
    w.add(12.0, 4)
    assert w.rate(12.0) == pytest.approx(9 / 2.0)  # the events at 10.0 left the window
    assert w.rate(20.0) == 0.0
    assert w.total == 14
    with pytest.raises(ValueError):
        WindowRate(0)
    steady = WindowRate(window_s=5.0)  # 10 Hz from its first event on: 10 per second at once
    for i in range(21):
        steady.add(i / 10)
    assert steady.rate(2.0) == pytest.approx(10.0)
    load = WindowRate(window_s=5.0)  # a busy fraction: the start marker carries nothing
    load.add(0.0, 0.0)
    load.add(1.0, 0.25)
    assert load.rate(1.0) == pytest.approx(0.25)


def test_action_frequency():
    assert action_frequency(50, 0.1) == pytest.approx(500.0)
    assert math.isnan(action_frequency(50, 0.0))
    assert math.isnan(action_frequency(50, math.nan))

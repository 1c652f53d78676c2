"""The language budget shrinks under overload and recovers with headroom."""

import pytest

from oxygen_ros.core.budget import DecodeBudget


def test_full_budget_until_measured_then_what_fits():
    b = DecodeBudget(k_max=5, deadline_ms=20.0, margin=1.0, smoothing=1.0)
    assert b.next_k() == 5
    b.observe(action_ms=10.0, decode_ms=4.0, steps=2)  # 2 ms a step, 10 ms left
    assert b.next_k() == 5
    b.observe(action_ms=15.0, decode_ms=4.0, steps=2)  # 5 ms left -> 2 steps
    assert b.next_k() == 2


def test_overload_goes_to_zero_and_recovers():
    b = DecodeBudget(k_max=5, deadline_ms=20.0, margin=0.9, smoothing=1.0)
    b.observe(action_ms=25.0, decode_ms=0.0, steps=0)  # slowed model: the action alone is late
    assert b.next_k() == 0
    b.observe(action_ms=25.0, decode_ms=0.0, steps=0)
    assert b.next_k() == 0
    b.observe(action_ms=5.0, decode_ms=0.0, steps=0)  # headroom is back; step cost remembered
    assert b.next_k() == 5


def test_smoothing_reacts_gradually():
    b = DecodeBudget(k_max=10, deadline_ms=100.0, margin=1.0, smoothing=0.5)
    b.observe(action_ms=20.0, decode_ms=10.0, steps=1)
    b.observe(action_ms=100.0, decode_ms=10.0, steps=1)  # estimate 60 ms -> 4 steps of 10 ms
    assert b.next_k() == 4


def test_bad_arguments():
    with pytest.raises(ValueError, match="deadline_ms"):
        DecodeBudget(k_max=1, deadline_ms=0)
    with pytest.raises(ValueError, match="k_max"):
        DecodeBudget(k_max=-1, deadline_ms=10)

"""Log throttling by key (oxygen_ros/core/throttle.py): a repeated message goes through at
most once per period, and the one that goes through says how many were suppressed since the
one before; each key has its own period and count."""

from oxygen_ros.core.throttle import Throttle


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_each_report_counts_the_messages_suppressed_since_the_last_one_per_key():
    clock = FakeClock()
    throttle = Throttle(5.0, clock)
    assert throttle("stale") == 0  # the first one goes through: nothing suppressed yet
    assert [throttle("stale") for _ in range(3)] == [None, None, None]
    assert throttle("late") == 0, "another key is not throttled by the first"
    assert throttle("late") is None
    clock.now += 5.0
    assert throttle("stale") == 3, "the three suppressed since the first"
    assert throttle("stale") is None
    clock.now += 5.0
    assert throttle("stale") == 1, "only the one suppressed since the last report, not all so far"
    assert throttle("late") == 1, "each key counts its own"
    clock.now += 5.0
    assert throttle("stale") == 0 and throttle("late") == 0, "nothing suppressed since the last reports"

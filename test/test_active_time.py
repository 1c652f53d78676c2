"""ActiveTime (oxygen_ros/core/active_time.py): the seconds a node's control tick ran, over its spells."""

from oxygen_ros.core.active_time import ActiveTime


def test_the_spells_between_start_and_stop_are_summed_and_the_current_one_counts_up_to_now():
    now = [10.0]
    t = ActiveTime(lambda: now[0])
    assert t.seconds() == 0.0
    t.start()
    now[0] = 12.0
    assert t.seconds() == 2.0  # the spell running now, so far
    t.stop()
    now[0] = 20.0  # inactive: not counted
    assert t.seconds() == 2.0
    t.start()
    now[0] = 21.5
    t.stop()
    assert t.seconds() == 3.5


def test_a_second_start_or_stop_in_a_row_changes_nothing():
    now = [0.0]
    t = ActiveTime(lambda: now[0])
    t.stop()  # never started (a shutdown before any activate)
    t.start()
    now[0] = 1.0
    t.start()  # does not restart the spell
    now[0] = 2.0
    t.stop()
    now[0] = 5.0
    t.stop()
    assert t.seconds() == 2.0

"""The tick board: what the control process reports back to the inference node, in shared memory."""

import numpy as np
import pytest

from oxygen_ros.core.tick_board import FIRSTS_KEPT, LATENESS_KEPT, TickBoard


@pytest.fixture
def board():
    b = TickBoard(robots=2)
    yield b
    b.close()
    b.unlink()


def test_a_reader_that_fell_behind_gets_the_newest_lateness_values_kept_in_order(board):
    """The node reads the ticks' lateness once a second; one that fell more than the ring behind
    (a stalled node) gets the newest LATENESS_KEPT values, oldest first, each once: no value
    overwritten since, read in place of an older one, and no value twice."""
    reader = TickBoard(2, name=board.name)
    try:
        for i in range(LATENESS_KEPT + 10):
            board.add_lateness(float(i))
        written, values = reader.lateness_since(0)
        assert written == LATENESS_KEPT + 10
        np.testing.assert_array_equal(values, np.arange(10, LATENESS_KEPT + 10, dtype=float))
        assert reader.lateness_since(LATENESS_KEPT + 5)[1].tolist() == [float(LATENESS_KEPT + i) for i in range(5, 10)]
        again, none = reader.lateness_since(written)
        assert again == written and none.size == 0
    finally:
        reader.close()


def test_a_reader_that_fell_behind_gets_the_newest_first_publications_kept_in_order(board):
    """The same for a robot's first publications of its chunks (frame records, the agent's report):
    the newest FIRSTS_KEPT, oldest first; the other robot's are its own."""
    for k in range(FIRSTS_KEPT + 5):
        board.add_first(1, frame_id=k, stamp_ns=10 * k, tick_ns=20 * k, mono_ns=30 * k)
    board.add_first(0, frame_id=7, stamp_ns=70, tick_ns=140, mono_ns=210)
    written, rows = board.firsts_since(1, 0)
    assert written == FIRSTS_KEPT + 5
    assert rows[:, 0].tolist() == list(range(5, FIRSTS_KEPT + 5))
    np.testing.assert_array_equal(rows[:, 1:], rows[:, :1] * np.array([10, 20, 30]))
    assert board.firsts_since(1, FIRSTS_KEPT + 3)[1][:, 0].tolist() == [FIRSTS_KEPT + 3, FIRSTS_KEPT + 4]
    assert board.firsts_since(0, 0)[0] == 1 and board.firsts_since(0, 0)[1].tolist() == [[7, 70, 140, 210]]

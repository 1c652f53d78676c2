"""oxygen-soak's token counts: a lost token is one lost token (and one index gap), never two."""

import pytest

from oxygen_ros.tools.token_tally import TokenTally


def _stream(tally, rid, messages):
    """messages: (index, token_id, done, reason); returns the add() results."""
    return [tally.add(rid, i, t, d, r) for i, t, d, r in messages]


def test_a_whole_stream_counts_no_fault():
    t = TokenTally()
    ended = _stream(t, 7, [(0, 11, False, ""), (1, 12, False, ""), (2, 1, True, "eos")])
    assert ended == [False, False, True]
    assert (t.started, t.tokens_received, t.tokens_lost, t.index_gaps) == (1, 3, 0, 0)
    assert t.ends == {"eos": 1} and t.open == {}


def test_one_lost_token_counts_once_as_lost_and_once_as_a_gap():
    t = TokenTally()
    _stream(t, 3, [(0, 11, False, ""), (2, 13, False, ""), (3, 1, True, "eos")])  # index 1 never came
    assert (t.tokens_received, t.tokens_lost, t.index_gaps) == (3, 1, 1)


def test_a_lost_first_message_and_a_done_without_a_token():
    t = TokenTally()
    # the first message lost; the request is cancelled with a done message that carries no token
    _stream(t, 4, [(1, 12, False, ""), (2, -1, True, "cancelled")])
    assert (t.started, t.tokens_received, t.tokens_lost, t.index_gaps) == (1, 1, 1, 1)
    assert t.ends == {"cancelled": 1}


def test_a_repeated_message_is_a_gap_but_loses_nothing():
    t = TokenTally()
    _stream(t, 5, [(0, 11, False, ""), (0, 11, False, ""), (1, 1, True, "eos")])
    assert (t.tokens_received, t.tokens_lost, t.index_gaps) == (3, 0, 1)


def test_interleaved_requests_are_kept_apart_and_only_open_ones_are_held():
    t = TokenTally()
    t.add(1, 0, 10, False, "")
    t.add(2, 0, 20, False, "")
    t.add(1, 1, 1, True, "eos")
    assert set(t.open) == {2}
    t.add(2, 1, 21, True, "length")
    assert t.open == {} and t.ends == {"eos": 1, "length": 1}
    assert (t.started, t.tokens_received, t.tokens_lost, t.index_gaps) == (2, 4, 0, 0)


def test_a_refused_question_is_not_a_request():
    with pytest.raises(ValueError, match="request_id 0"):
        TokenTally().add(0, 0, -1, True, "rejected")

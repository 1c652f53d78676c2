"""The request manager: admission (FIFO, bounded queue, rejection), the σ
operations Store / Update / Remove, finishing, cancelling, slot moves."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oxygen_ros.core.kv_pool import SCRATCH, KVPool
from oxygen_ros.core.model.cache import KVCache
from oxygen_ros.core.requests import FinishReason, RequestManager
from oxygen_ros.core.tokenizer import Tokenizer

TOK = Tokenizer.default()


def make(max_active=2, queue_limit=1, slots=None, max_len=64):
    managers = []
    cache = KVCache.allocate(layers=1, kv_heads=1, head_dim=4, slots=slots or max_active + 2, max_len=max_len)
    pool = KVPool(cache, on_move=lambda owner, src, dst: managers[0].moved(owner, dst))
    managers.append(RequestManager(pool, TOK, max_active=max_active, queue_limit=queue_limit))
    return pool, managers[0]


def start(pool, mgr, requests):
    for r in requests:
        mgr.store(r, pool.allocate(SCRATCH))


def test_admission_is_first_come_first_served_with_a_bounded_queue():
    pool, mgr = make(max_active=2, queue_limit=1)
    a, b, c, d = (mgr.new(1, 5) for _ in range(4))
    starting, rejected = mgr.admit([a, b, c, d])
    assert starting == [a, b] and list(mgr.queue) == [c] and rejected == [d]
    assert d.finish_reason is FinishReason.REJECTED and d.done
    start(pool, mgr, starting)
    mgr.remove(a.id)
    e = mgr.new(2, 5)
    starting, rejected = mgr.admit([e])
    assert starting == [c], "the queued request goes before a newer one"
    assert list(mgr.queue) == [e] and rejected == []


def test_store_hands_the_slot_to_the_request_and_remove_frees_it():
    pool, mgr = make()
    r = mgr.new(1, 5)
    slot = pool.allocate(SCRATCH)
    mgr.store(r, slot)
    assert pool.owner(slot) == r.id and r.slot == slot and mgr.active == {r.id: r}
    with pytest.raises(ValueError, match="already active"):
        mgr.store(r, slot)
    mgr.remove(r.id)
    assert pool.owner(slot) is None and r.slot is None and not mgr.active


def test_update_streams_tokens_and_finishes_at_eos_or_length():
    pool, mgr = make()
    short, long = mgr.new(1, 2), mgr.new(1, 5)
    start(pool, mgr, [short, long])
    first = mgr.update(short.id, 10, TOK.eos_id)
    assert (first.index, first.done, first.finish_reason) == (0, False, "")
    last = mgr.update(short.id, 11, TOK.eos_id)
    assert last.done and last.finish_reason == "length" and short.tokens == [10, 11]
    eos = mgr.update(long.id, TOK.eos_id, TOK.eos_id)
    assert eos.done and eos.finish_reason == "eos"
    with pytest.raises(ValueError, match="already finished"):
        mgr.update(long.id, 12, TOK.eos_id)
    assert list(mgr.running()) == []


def test_cancel_all_finishes_running_and_queued_requests_and_frees_their_slots():
    pool, mgr = make(max_active=1, queue_limit=2)
    running, waiting = mgr.new(1, 5), mgr.new(1, 5)
    starting, _ = mgr.admit([running, waiting])
    start(pool, mgr, starting)
    events = mgr.cancel_all()
    assert [(e.request_id, e.finish_reason, e.token_id) for e in events] == [
        (running.id, "cancelled", -1), (waiting.id, "cancelled", -1)]
    assert pool.held == 0 and not mgr.active and not mgr.queue


def test_a_request_follows_its_slot_when_the_pool_compacts():
    pool, mgr = make(max_active=3, slots=4)
    a, b, c = (mgr.new(1, 5) for _ in range(3))
    start(pool, mgr, [a, b, c])
    mgr.remove(a.id)
    mgr.remove(b.id)  # holes at 0 and 1, c at 2
    pool.allocate_run(2, SCRATCH)  # slots 0-1: no compaction needed
    pool.release(0)
    pool.release(1)
    mgr.remove(c.id)
    d, e = mgr.new(2, 5), mgr.new(2, 5)
    start(pool, mgr, [d, e])  # slots 0 and 1
    mgr.remove(d.id)  # hole at 0, e at 1
    run = pool.allocate_run(3, SCRATCH)  # no run of 3 without moving e down
    assert run == 1 and e.slot == 0 and pool.owner(0) == e.id


ops = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), st.integers(1, 3)),
        st.tuples(st.just("token"), st.integers(0, 50)),
        st.tuples(st.just("remove"), st.integers(0, 50)),
        st.tuples(st.just("compact"), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, max_active=st.integers(1, 4), queue_limit=st.integers(0, 3))
def test_manager_invariants_under_random_operations(ops, max_active, queue_limit):
    pool, mgr = make(max_active=max_active, queue_limit=queue_limit)
    produced: dict[int, list[int]] = {}
    rejected, removed = [], {}
    frame = 0
    for op, arg in ops:
        frame += 1
        if op == "arrive":
            new = [mgr.new(frame, max_tokens=5) for _ in range(arg)]
            starting, rej = mgr.admit(new)
            rejected += rej
            for r in starting:
                mgr.store(r, pool.allocate(SCRATCH))
                produced[r.id] = []
            assert len(mgr.queue) <= queue_limit
            assert all(r.finish_reason is FinishReason.REJECTED for r in rej)
        elif op == "token" and mgr.active:
            rid = sorted(mgr.active)[arg % len(mgr.active)]
            token = 10 + arg
            ev = mgr.update(rid, token, eos_id=TOK.eos_id)
            produced[rid].append(token)
            if not ev.done:
                pool.advance(mgr.active[rid].slot)
            assert ev.index == len(produced[rid]) - 1
            if ev.done:
                removed[rid] = mgr.remove(rid)
        elif op == "remove" and mgr.active:
            rid = sorted(mgr.active)[arg % len(mgr.active)]
            removed[rid] = mgr.remove(rid)
        elif op == "compact":
            pool.compact()
        # invariants
        slots = [r.slot for r in mgr.active.values()]
        assert len(slots) == len(set(slots)), "a slot held by two live requests"
        assert all(pool.owner(r.slot) == r.id for r in mgr.active.values())
        assert len(mgr.active) <= max_active
        assert pool.held == len(mgr.active)
        for rid, r in mgr.active.items():
            assert r.tokens == produced[rid]
        for rid, r in removed.items():
            assert r.tokens == produced[rid], "tokens lost or duplicated"
    # every rejected request was reported; no request both rejected and started
    assert not {r.id for r in rejected} & set(produced)
    # freed slots are reused: after removing everything, the pool can be filled again
    for rid in list(mgr.active):
        mgr.remove(rid)
    assert pool.held == 0
    assert [pool.allocate(i) for i in range(pool.capacity)] == list(range(pool.capacity))


def test_cancelling_a_client_ends_only_its_requests_and_frees_the_slot_at_once():
    pool, mgr = make(max_active=2, queue_limit=2)
    mine, other, queued = mgr.new(1, 5, client_id="ask/1"), mgr.new(1, 5, client_id="b"), mgr.new(1, 5,
                                                                                                 client_id="ask/2")
    starting, _ = mgr.admit([mine, other, queued])
    start(pool, mgr, starting)
    assert pool.held == 2 and list(mgr.queue) == [queued]
    events = mgr.cancel_clients(["ask/1", "ask/2", "nobody"])
    assert [(e.client_id, e.finish_reason, e.done) for e in events] == [("ask/1", "cancelled", True),
                                                                        ("ask/2", "cancelled", True)]
    assert pool.held == 1 and list(mgr.active) == [other.id] and not mgr.queue
    assert mgr.cancel_clients(["ask/1"]) == []  # already ended: nothing more


def test_the_queue_starts_waiting_requests_in_arrival_order():
    pool, mgr = make(max_active=1, queue_limit=3)
    a, b, c, d = (mgr.new(1, 5) for _ in range(4))
    starting, rejected = mgr.admit([a, b, c, d])
    assert starting == [a] and rejected == [] and list(mgr.queue) == [b, c, d]
    start(pool, mgr, starting)
    order = [a]
    for _ in range(3):
        mgr.remove(order[-1].id)  # the running one finishes: the next waiting one starts
        starting, _ = mgr.admit([])
        assert len(starting) == 1
        start(pool, mgr, starting)
        order += starting
    assert [r.id for r in order] == [a.id, b.id, c.id, d.id], "waiting requests start first come, first served"


def test_a_request_cut_off_inside_a_character_streams_what_the_tokenizer_decodes():
    pool, mgr = make()
    r = mgr.new(1, max_tokens=2)
    start(pool, mgr, [r])
    ids = TOK.encode("a") + TOK.encode("é")[:1]  # "a", then the first byte of é (0xC3): max_tokens reached
    assert len(ids) == 2 and TOK.piece_bytes(ids[1]) == b"\xc3"
    first = mgr.update(r.id, ids[0], TOK.eos_id)
    last = mgr.update(r.id, ids[1], TOK.eos_id)
    assert last.done and last.finish_reason == "length"
    assert last.piece == "\ufffd", "the truncated character is flushed as U+FFFD"
    assert first.piece + last.piece == r.text == TOK.decode(r.tokens) == "a\ufffd"


def test_cancelling_one_robots_client_leaves_another_robots_same_client_id_running():
    pool, mgr = make(max_active=2, queue_limit=2)
    left, right = mgr.new(1, 5, client_id="ask/1", robot="left"), mgr.new(1, 5, client_id="ask/1", robot="right")
    left_waiting = mgr.new(1, 5, client_id="ask/1", robot="left")
    right_waiting = mgr.new(1, 5, client_id="ask/1", robot="right")
    starting, _ = mgr.admit([left, right, left_waiting, right_waiting])
    start(pool, mgr, starting)
    events = mgr.cancel_clients(["ask/1"], robot="left")
    assert sorted(e.request_id for e in events) == sorted([left.id, left_waiting.id])
    assert all(e.robot == "left" and e.finish_reason == "cancelled" for e in events)
    assert list(mgr.active) == [right.id] and not right.done, "the other robot's request still runs"
    assert list(mgr.queue) == [right_waiting] and not right_waiting.done
    assert pool.held == 1

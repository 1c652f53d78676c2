"""The KV pool and request manager under random operation sequences (hypothesis)."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oxygen_ros.core.kv_pool import KVPool, PoolFull
from oxygen_ros.core.model.cache import KVCache
from oxygen_ros.core.requests import FinishReason, RequestManager
from oxygen_ros.core.tokenizer import Tokenizer

TOK = Tokenizer.default()


def make_pool(slots=6, max_len=16):
    return KVPool(KVCache.allocate(layers=2, kv_heads=1, head_dim=4, slots=slots, max_len=max_len))


def test_allocation_is_lowest_first_and_runs_are_contiguous():
    pool = make_pool()
    a, b, c = (pool.allocate(x) for x in "abc")
    assert (a, b, c) == (0, 1, 2)
    pool.release(b)
    assert pool.allocate("d") == 1  # the hole is reused
    assert pool.allocate_run(3, "run") == 3
    assert pool.span() == 6 and pool.free == 0
    try:
        pool.allocate("x")
    except PoolFull as e:
        assert "free" in str(e)
    else:
        raise AssertionError("a full pool must refuse")


def test_compaction_moves_data_and_counts_the_copy():
    pool = make_pool(slots=4)
    moved = []
    pool.on_move = lambda owner, src, dst: moved.append((owner, src, dst))
    for s, name in enumerate("abcd"):
        assert pool.allocate(name) == s
        pool.cache.k[:, s, :, :5] = float(s + 1)
        pool.lengths[s] = 5
    pool.release(0)
    pool.release(2)  # holes at 0 and 2: no run of 2
    assert pool.allocate_run(2, "new") == 2
    assert moved == [("d", 3, 0)]
    assert torch.equal(pool.cache.k[:, 0, :, :5], torch.full_like(pool.cache.k[:, 0, :, :5], 4.0))
    assert pool.copy_bytes == 5 * pool.cache.bytes_per_token()


def test_bytes_reserved_and_in_use():
    pool = make_pool(slots=3, max_len=8)
    per = pool.cache.bytes_per_token()
    assert pool.bytes_reserved == 4 * 8 * per  # 3 slots + trash
    s = pool.allocate("a")
    pool.lengths[s] = 5
    assert pool.bytes_in_use == 5 * per


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
    pool = make_pool(slots=max_active + 2, max_len=64)
    mgr = RequestManager(pool, TOK, max_active=max_active, queue_limit=queue_limit)
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
                mgr.store(r, pool.allocate("scratch"))
                produced[r.id] = []
            assert len(mgr.queue) <= queue_limit
            assert all(r.finish_reason is FinishReason.REJECTED for r in rej)
        elif op == "token" and mgr.active:
            rid = sorted(mgr.active)[arg % len(mgr.active)]
            token = 10 + arg
            ev = mgr.update(rid, token, eos_id=TOK.eos_id)
            produced[rid].append(token)
            pool.lengths[mgr.active[rid].slot] += 1
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

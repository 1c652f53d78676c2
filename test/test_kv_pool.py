"""The KV pool: lowest-first allocation, compaction, lengths, accounting, threads."""

import pytest
import torch
from engine_harness import run_interleaved

from oxygen_ros.core.kv_pool import KVPool, PoolFull
from oxygen_ros.core.model.cache import KVCache


def make_pool(slots=6, max_len=16, on_move=None):
    return KVPool(KVCache.allocate(layers=2, kv_heads=1, head_dim=4, slots=slots, max_len=max_len), on_move)


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
    moved = []
    pool = make_pool(slots=4, on_move=lambda owner, src, dst: moved.append((owner, src, dst)))
    for s, name in enumerate("abcd"):
        assert pool.allocate(name) == s
        pool.cache.k[:, s, :, :5] = float(s + 1)
        pool.set_length(s, 5)
    pool.release(0)
    pool.release(2)  # holes at 0 and 2: no run of 2
    assert pool.allocate_run(2, "new") == 2
    assert moved == [("d", 3, 0)]
    assert pool.owner(0) == "d" and pool.length(0) == 5 and pool.length(3) == 0
    assert torch.equal(pool.cache.k[:, 0, :, :5], torch.full_like(pool.cache.k[:, 0, :, :5], 4.0))
    assert pool.copy_bytes == 5 * pool.cache.bytes_per_token()


def test_bytes_reserved_and_in_use():
    pool = make_pool(slots=3, max_len=8)
    per = pool.cache.bytes_per_token()
    assert pool.bytes_reserved == 4 * 8 * per  # 3 slots + trash
    s = pool.allocate("a")
    pool.set_length(s, 5)
    assert pool.bytes_in_use == 5 * per


def test_lengths_change_only_through_the_pool_and_only_for_held_slots():
    pool = make_pool(slots=3, max_len=8)
    s = pool.allocate("a")
    pool.set_length(s, 3)
    pool.advance(s, 2)
    assert pool.length(s) == 5
    with pytest.raises(ValueError, match="slot 1 is free"):
        pool.advance(1)
    with pytest.raises(ValueError, match="out of range"):
        pool.advance(s, 4)  # 9 tokens in a slot of 8
    assert pool.length(s) == 5, "a refused change leaves the length as it was"
    pool.release(s)
    assert pool.length(s) == 0


def test_two_threads_allocating_and_releasing_never_share_a_slot():
    pool = make_pool(slots=4)
    errors = []

    def churn(owner):
        try:
            for _ in range(2000):
                s = pool.allocate(owner)
                if pool.owner(s) != owner:
                    errors.append((owner, s, pool.owner(s)))
                pool.advance(s)
                pool.release(s)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    run_interleaved(lambda: churn("actions"), lambda: churn("language"))
    assert errors == []
    assert pool.held == 0

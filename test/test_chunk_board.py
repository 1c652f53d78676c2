"""The chunk board: each robot's newest chunk in shared memory, read whole or not at all."""

import multiprocessing

import numpy as np
import pytest

from oxygen_ros.core.chunk_board import ChunkBoard, TornRead
from oxygen_ros.core.chunk_clock import Chunk


def _chunk(k: int, horizon: int = 4, dim: int = 3, origin=None) -> Chunk:
    return Chunk(np.full((horizon, dim), float(k)), 20_000_000 + k, origin, frame_id=k, observation_seq=k,
                 observation_stamp_ns=1000 * k, ready_ns=2000 * k)


@pytest.fixture
def board():
    b = ChunkBoard(robots=2, horizon=4, action_dim=3)
    yield b
    b.close()
    b.unlink()


def test_a_reader_in_another_board_sees_each_robots_newest_chunk(board):
    reader = ChunkBoard(2, 4, 3, name=board.name)
    try:
        assert reader.read(0) == (0, None) and reader.read(1) == (0, None)
        board.write(0, _chunk(1, origin=5_000))
        board.write(0, _chunk(2))
        v, got = reader.read(0)
        assert v == board.version(0) == 4 and reader.read(1) == (0, None)
        want = _chunk(2)
        assert got.origin_ns is None and (got.period_ns, got.frame_id, got.observation_seq) == (want.period_ns, 2, 2)
        assert (got.observation_stamp_ns, got.ready_ns) == (2000, 4000)
        np.testing.assert_array_equal(got.actions, want.actions)
        board.write(1, _chunk(3, origin=7_000))
        assert reader.read(1)[1].origin_ns == 7_000
        board.write(0, None)  # the robot's output stopped
        assert reader.read(0) == (6, None)
    finally:
        reader.close()


def test_bad_sizes_are_refused_by_name(board):
    with pytest.raises(ValueError, match=r"robot 1's chunk has shape \(5, 3\), the board holds \(4, 3\)"):
        board.write(1, Chunk(np.zeros((5, 3)), 1, None))
    assert board.version(1) == 0  # nothing half-written
    with pytest.raises(ValueError, match="needs horizon >= 1"):
        ChunkBoard(1, 0, 3)
    with pytest.raises(ValueError, match="needs"):
        ChunkBoard(4, 40, 3, name=board.name)  # bigger than the block


def _hammer(name: str, writes: int) -> None:
    board = ChunkBoard(2, 4, 3, name=name)
    for k in range(1, writes + 1):
        board.write(k % 2, _chunk(k))
    board.close()


def _reader_exits(name: str) -> None:
    ChunkBoard(2, 4, 3, name=name).close()


def test_a_read_is_never_torn_while_another_process_writes(board):
    """Every chunk read while another process rewrites both slots is one whole chunk."""
    ctx = multiprocessing.get_context("spawn")
    writer = ctx.Process(target=_hammer, args=(board.name, 200_000))
    writer.start()
    seen = set()
    try:
        while writer.is_alive() or not seen:
            for robot in (0, 1):
                try:
                    _, chunk = board.read(robot)
                except TornRead:  # written through every try: no chunk, and nothing torn either
                    continue
                if chunk is None:
                    continue
                k = chunk.frame_id
                assert k % 2 == robot and chunk.observation_seq == k and chunk.period_ns == 20_000_000 + k
                assert (chunk.observation_stamp_ns, chunk.ready_ns) == (1000 * k, 2000 * k)
                assert np.all(chunk.actions == k), f"chunk {k} read with rows of another"
                seen.add(k)
    finally:
        writer.join(60)
    assert writer.exitcode == 0
    assert len(seen) > 100, "the reads did not overlap the writes"
    assert board.read(0)[1].frame_id == 200_000 and board.read(1)[1].frame_id == 199_999


def test_a_reader_process_ending_leaves_the_block_to_its_creator(board):
    board.write(0, _chunk(9))
    ctx = multiprocessing.get_context("spawn")
    p = ctx.Process(target=_reader_exits, args=(board.name,))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    again = ChunkBoard(2, 4, 3, name=board.name)  # still there
    assert again.read(0)[1].frame_id == 9
    again.close()

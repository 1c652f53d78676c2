"""The control tick in a process of its own (oxygen_ros/ros/control_process.py): each
robot's newest chunk, written to the shared-memory board by this process, goes out on
that robot's topic from the other process, row by row on the tick grid, then held."""

import json
import os
import select
import signal
import subprocess
import sys
import time

import numpy as np
from ros_harness import checkout_env, process_ended, reliable, unique_prefix, until

from oxygen_ros.core.chunk_board import ChunkBoard
from oxygen_ros.core.chunk_clock import Chunk
from oxygen_ros.core.tick_board import TickBoard

PERIOD_NS = 10_000_000
H, D = 5, 3
PARENT_THAT_DIES = """
import subprocess, sys
proc = subprocess.Popen([sys.executable, "-m", "oxygen_ros.ros.control_process", sys.argv[1]], stdout=subprocess.PIPE,
                        text=True)
assert proc.stdout.readline().strip() == "control process ready"
print(proc.pid, flush=True)
"""


def _chunk(frame_id: int, base: float) -> Chunk:
    rows = base + np.arange(H)[:, None] * 10.0 + np.arange(D)[None, :]
    return Chunk(rows, PERIOD_NS, None, frame_id=frame_id, observation_seq=frame_id)


def _spec(tmp_path, board: ChunkBoard, ticks: TickBoard, topics: list[str]):
    """The control process's SPEC.json for ``board`` and ``ticks``, one robot per topic (written; its path)."""
    for field, value in (("running", 1), ("period_ns", PERIOD_NS), ("hold_last", 1)):  # as the node sets them
        ticks.set(field, value)
    spec = {"board": board.name, "ticks": ticks.name, "horizon": H, "action_dim": D, "period_ns": PERIOD_NS, "priority": 0,
            "node": "oxygen_test", "namespace": "/", "robots": [[t, ""] for t in topics],
            "params": {"hold_action": "last", "control_frame": "", "joint_names": []}}
    path = tmp_path / "control.json"
    path.write_text(json.dumps(spec))
    return path


def _start(tmp_path, board: ChunkBoard, ticks: TickBoard, topics: list[str]) -> subprocess.Popen:
    path = _spec(tmp_path, board, ticks, topics)
    proc = subprocess.Popen([sys.executable, "-m", "oxygen_ros.ros.control_process", str(path)],
                            env=checkout_env(), stdout=subprocess.PIPE, text=True)
    assert select.select([proc.stdout], [], [], 60)[0] and proc.stdout.readline().strip() == "control process ready"
    return proc


def _end(proc, board: ChunkBoard, ticks: TickBoard) -> None:
    """The control process killed if it still runs, the shared-memory blocks freed."""
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()
    for block in (board, ticks):
        block.close()
        block.unlink()


def test_each_robots_chunk_goes_out_from_the_control_process_row_by_row_then_held(ros, tmp_path):
    from oxygen_ros.msg import ActionChunk

    prefix = unique_prefix()
    topics = [f"{prefix}/a/actions", f"{prefix}/b/actions"]
    board, ticks = ChunkBoard(2, H, D), TickBoard(2)
    proc = None
    try:
        proc = _start(tmp_path, board, ticks, topics)
        got = {t: [] for t in topics}
        node = ros.node("oxygen_test_control_process")
        for t in topics:
            node.create_subscription(ActionChunk, t, got[t].append, reliable(100))
        # the process's publishers have matched these subscriptions (reported on the tick board):
        # a reliable writer sends nothing to a reader it has not matched yet
        assert until(lambda: all(node.count_publishers(t) == 1 for t in topics)
                     and all(ticks.robot(slot)[0]["subscribers"] == 1 for slot in (0, 1)), 20)
        board.write(0, _chunk(1, 100.0))
        board.write(1, _chunk(2, 200.0))
        assert until(lambda: all(sum(m.frame_id > 0 for m in got[t]) >= H + 3 for t in topics), 20)
        for t, frame, base in ((topics[0], 1, 100.0), (topics[1], 2, 200.0)):
            msgs = [m for m in got[t] if m.frame_id == frame]
            assert [m.offset for m in msgs[:H + 2]] == [0, 1, 2, 3, 4, H, H]  # rows in turn, then the last held
            rows = _chunk(frame, base).actions
            for m in msgs[:H]:
                np.testing.assert_allclose(np.asarray(m.actions).reshape(-1, D), rows[m.offset:], rtol=1e-6)
            np.testing.assert_allclose(np.asarray(msgs[H].actions).reshape(-1, D), rows[-1:], rtol=1e-6)
            stamps = [m.header.stamp.sec * 10**9 + m.header.stamp.nanosec for m in msgs[:H + 2]]
            assert np.all(np.diff(stamps) == PERIOD_NS), stamps  # one period apart, on the grid
        n_b = len(got[topics[1]])
        board.write(0, _chunk(3, 300.0))  # a new chunk for robot a only
        assert until(lambda: sum(m.frame_id == 3 for m in got[topics[0]]) >= 2, 20)
        assert [m.offset for m in got[topics[0]] if m.frame_id == 3][:2] == [0, 1]
        assert until(lambda: len(got[topics[1]]) > n_b + 2, 20)
        assert {m.frame_id for m in got[topics[1]][n_b:]} == {2}  # b still holds its own
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
        # what went out, reported back on the tick board: each robot's counts, its chunks' first
        # publications, every tick's lateness
        for slot, t, frames in ((0, topics[0], [1, 3]), (1, topics[1], [2])):
            counts, _, _ = ticks.robot(slot)
            assert counts["actions_published"] == len(got[t]) == counts["published"] + counts["hold_ticks"]
            assert counts["ticks"] >= counts["published"] + counts["waiting"] and counts["ticks_faulted"] == 0
            _, firsts = ticks.firsts_since(slot, 0)
            assert firsts[:, 0].tolist() == frames
        written, lateness = ticks.lateness_since(0)
        assert written == ticks.robot(0)[0]["ticks"] and len(lateness) == written and (lateness >= 0).all()
    finally:
        _end(proc, board, ticks)


def test_the_control_process_ends_when_its_parent_ends(ros_env, tmp_path):
    board, ticks = ChunkBoard(1, H, D), TickBoard(1)
    try:
        path = _spec(tmp_path, board, ticks, [f"{unique_prefix()}/actions"])
        with open(tmp_path / "stderr", "w") as err:  # a file: the orphan holds it open, a pipe would never end
            parent = subprocess.run([sys.executable, "-c", PARENT_THAT_DIES, str(path)],
                                    env=checkout_env(), stdout=subprocess.PIPE, stderr=err, text=True, timeout=120)
        assert parent.returncode == 0, (tmp_path / "stderr").read_text()[-2000:]
        child = int(parent.stdout.strip())
        gone = until(lambda: process_ended(child), 10)
        if not gone:
            os.kill(child, signal.SIGKILL)
        assert gone, "the control process outlived its parent"
    finally:
        for block in (board, ticks):
            block.close()
            block.unlink()


def test_a_control_process_whose_node_is_already_gone_does_not_start(ros_env, tmp_path):
    """The node's pid comes in the spec: a node that ended before the process looked at its
    parent (it would then see init's pid and never notice) leaves no process ticking."""
    board, ticks = ChunkBoard(1, H, D), TickBoard(1)
    try:
        path = _spec(tmp_path, board, ticks, [f"{unique_prefix()}/actions"])
        spec = json.loads(path.read_text())
        path.write_text(json.dumps({**spec, "parent": os.getpid() + 10**6}))  # not this process's parent
        run = subprocess.run([sys.executable, "-m", "oxygen_ros.ros.control_process", str(path)],
                             env=checkout_env(), capture_output=True, text=True, timeout=60)
        assert run.returncode == 1 and "ready" not in run.stdout, run.stdout + run.stderr
    finally:
        for block in (board, ticks):
            block.close()
            block.unlink()


def test_an_activate_empties_every_output_even_one_the_process_never_saw_paused(ros, tmp_path):
    """A deactivate and an activate within one control period: the process never reads the
    pause, yet nothing it held from before goes out (here the board keeps the old chunk,
    as when the activate's tick finds a slot mid-write), and the robot waits for its next
    chunk instead of counting faulted ticks (its output was not stopped by failures)."""
    from oxygen_ros.msg import ActionChunk

    prefix = unique_prefix()
    topic = f"{prefix}/a/actions"
    board, ticks = ChunkBoard(1, H, D), TickBoard(1)
    proc = None
    try:
        proc = _start(tmp_path, board, ticks, [topic])
        got = []
        node = ros.node("oxygen_test_control_activate")
        node.create_subscription(ActionChunk, topic, got.append, reliable(1000))
        assert until(lambda: ticks.robot(0)[0]["subscribers"] == 1, 20)
        board.write(0, _chunk(1, 100.0))
        assert until(lambda: len(got) >= H + 3, 20)  # its rows, then its last row held (hold_last)
        ticks.set("running", 0)  # the node's deactivate, and at once its next activate (epoch 2)
        ticks.set("running", 2)
        activated_ns = time.time_ns()
        before = dict(ticks.robot(0)[0])
        assert until(lambda: ticks.robot(0)[0]["ticks"] >= before["ticks"] + 20, 10)
        # judged by the ticks' stamps, not by arrival (the test's own executor may lag): at most
        # a tick or two in flight at the activate
        late = [(m.frame_id, m.offset) for m in got
                if m.header.stamp.sec * 10**9 + m.header.stamp.nanosec > activated_ns + 2 * PERIOD_NS]
        assert late == [], late
        after = ticks.robot(0)[0]
        assert after["ticks_faulted"] == before["ticks_faulted"]
        assert after["waiting"] >= before["waiting"] + 18
        board.write(0, _chunk(2, 200.0))  # the next chunk goes out at once
        assert until(lambda: any(m.frame_id == 2 for m in got), 10)
    finally:
        _end(proc, board, ticks)

"""Isolation between robots on one inference node, on real DDS.

Robot ``a`` is replayed in lockstep (each observation waits for the chunk of the one
before) twice: served alone, and beside robot ``b``, which after one good
observation sends only malformed images (20 Hz) and a flood of questions (100 a
second), from a process of its own (``flood_robot.py``), as a robot on another
computer would. Robot ``a``'s chunks still arrive on every tick, and its actions
match those it got alone.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from robot_harness import RobotClient, robots_node
from ros_harness import checkout_env, until, unique_prefix

STEPS = 8
#: Robot a's control rate. The lockstep client sends its next observation only once the
#: chunk of the one before has come back, so the gap between two chunks is a whole round
#: trip through this test's process (its DDS, the frame, the client's polling): at 20 Hz a
#: chunk of the default model's 10 rows covers 500 ms. At 50 Hz (200 ms) that round trip
#: overran now and then on a loaded 2-core machine (both cores busy elsewhere: 6-19
#: underruns in 3 of 4 runs of the shared replay); a flood that stalled a's frames for
#: longer than a chunk still shows.
CONTROL_RATE_HZ = 20.0


def _replay_a(ros, robots, flood: bool):
    """Robot a's first chunk message of each of its STEPS observations, its tick counts, the node."""
    prefix = unique_prefix()
    node = robots_node(ros, prefix, robots, max_observation_age=0.0, control_rate_hz=CONTROL_RATE_HZ)
    test_node = ros.node("oxygen_test_isolation")
    clients = {r: RobotClient(test_node, prefix, r) for r in robots}
    for c in clients.values():
        c.wait_discovered(node)
    a, b, flooder = clients["a"], clients.get("b"), None
    if b is not None:  # one good observation: b's questions are answered, and decode beside a's frames
        b.observe(instruction="describe the scene")
        assert until(lambda: b.chunks, timeout=30.0)
    if flood:
        flooder = subprocess.Popen([sys.executable, str(Path(__file__).with_name("flood_robot.py")), f"/b{prefix}",
                                    os.environ["ROS_DOMAIN_ID"]], env=checkout_env(), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        assert flooder.stdout.readline().strip() == "flooding"
        assert until(lambda: node.diagnostics("b")["questions_received"] > 50, timeout=30.0)
    try:
        first = {}
        for step in range(STEPS):
            seq = a.observe(instruction="pick up the red cube", state=(0.1 * step, -0.2))
            assert until(lambda: a.chunks_of(seq), timeout=30.0, period=0.005), f"no chunk for a's observation {seq}"
            first[seq] = a.chunks_of(seq)[0]
        return first, node.tick_counts("a"), node
    finally:
        if flooder is not None:
            flooder.kill()
            flooder.wait(10)


def test_a_robot_is_not_delayed_or_changed_by_another_robots_bad_input_and_question_flood(ros):
    alone, _, _ = _replay_a(ros, ["a"], flood=False)
    shared, ticks, node = _replay_a(ros, ["a", "b"], flood=True)
    b = node.diagnostics("b")
    assert b["observations_invalid"] > 10 and b["questions_received"] > 50
    assert node.diagnostics("a")["observations_invalid"] == 0
    for seq in range(STEPS):
        assert shared[seq].offset == alone[seq].offset == 0
        np.testing.assert_allclose(np.asarray(shared[seq].actions), np.asarray(alone[seq].actions), atol=1e-4,
                                   err_msg=f"robot a's observation {seq}")
    assert not np.allclose(alone[0].actions, alone[1].actions)  # the replay is not trivially constant
    # a's chunks went out on every tick from its first chunk on
    assert ticks["underruns"] == 0, ticks

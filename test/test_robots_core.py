"""Several robots in the ROS-free core: one frame for all, each robot's inputs its own.

A robot's actions do not depend on who shares its frames (noise keyed by the robot
and its own frame count, batched prefill and denoise equal to the robot alone);
questions are answered from the asking robot's observation; when more robots wait
than a frame takes, the longest unserved go first and none starves.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from engine_harness import run_interleaved, scene_observations

from oxygen_ros.core.engine import Engine, EngineConfig, Question
from oxygen_ros.core.frame_loop import Arrival, FrameLoop, LoopSettings
from oxygen_ros.core.robot_inputs import noise_seed
from oxygen_ros.core.tokenizer import Tokenizer

S = 1_000_000_000


def _engine(model, observations_per_frame: int) -> Engine:
    return Engine(model, Tokenizer.default(), EngineConfig(max_observations_per_frame=observations_per_frame,
                                                           language_every_n_frames=0))


def _loop(engine, robots):
    return FrameLoop(engine, LoopSettings(), engine.model.config.max_token_len, horizon=10,
                     log=logging.getLogger("test_robots_core"), robots=robots, seed=3)


def _arrival(robot, seq, t_s):
    return Arrival(f"{robot}{seq}", seq, int(t_s * S), int(t_s * S), int(t_s * S), robot)


def test_a_robots_actions_are_the_same_alone_and_batched_with_others(lively_tiny):
    scenes = scene_observations(3, seed=5)
    alone, shared = _engine(lively_tiny, 1), _engine(lively_tiny, 3)
    for frame in range(3):
        seeds = [noise_seed(0, r, frame) for r in ("a", "b", "c")]
        a = alone.step([scenes[0]], robots=["a"], noise_seeds=seeds[:1]).actions[0]
        # robot a in another place of a frame that also serves b and c
        together = shared.step([scenes[1], scenes[0], scenes[2]], robots=["b", "a", "c"],
                               noise_seeds=[seeds[1], seeds[0], seeds[2]]).actions
        np.testing.assert_allclose(together[1], a, atol=1e-5)
        assert not np.allclose(together[0], a, atol=1e-3)  # another robot, another scene and noise


def test_questions_are_answered_from_the_asking_robots_newest_observation(lively_tiny):
    engine = _engine(lively_tiny, 2)
    scenes = scene_observations(2, seed=1)
    engine.step([scenes[0]], robots=["a"])
    with pytest.raises(ValueError, match="robot 'b'"):
        engine.step([], [Question("what?", "q", robot="b")])
    engine.step([scenes[1]], robots=["b"])
    res = engine.step([], [Question("what?", "qa", robot="a"), Question("what?", "qb", robot="b")])
    by_client = {r.client_id: r for r in engine.requests.active.values()} | {r.client_id: r for r in res.finished}
    assert by_client["qa"].robot == "a" and by_client["qb"].robot == "b"
    assert {e.robot for e in res.tokens if e.client_id == "qa"} == {"a"}
    assert {e.robot for e in res.tokens if e.client_id == "qb"} == {"b"}
    engine.cancel_all()


def test_the_longest_unserved_robots_go_first_and_none_starves(lively_tiny):
    engine = _engine(lively_tiny, 2)
    loop = _loop(engine, ["a", "b", "c", "d"])
    served = []
    for frame in range(6):
        t = 10.0 + frame * 0.1
        for robot in "abcd":
            loop.observation_arrived(_arrival(robot, frame, t))
        job = loop.next_job(int(t * S), int(t * S) + frame)
        assert len(job.observations) == 2
        served.append("".join(sorted(a.robot for a in job.observations)))
    assert served == ["ab", "cd", "ab", "cd", "ab", "cd"]
    # the robots left waiting kept their newest observation
    assert loop.robot("a").pending is not None and loop.robot("a").pending.seq == 5


def test_each_robots_noise_follows_its_own_frames(lively_tiny):
    loop = _loop(_engine(lively_tiny, 2), ["a", "b"])
    loop.observation_arrived(_arrival("a", 0, 10.0))
    first = loop.next_job(10 * S, 1).observations[0]
    for t in (10.1, 10.2):  # b's frames do not move a's noise on
        loop.observation_arrived(_arrival("b", 0, t))
        loop.next_job(int(t * S), 2)
    loop.observation_arrived(_arrival("a", 1, 10.3))
    second = loop.next_job(int(10.3 * S), 3).observations[0]
    assert (first.noise_seed, second.noise_seed) == (noise_seed(3, "a", 0), noise_seed(3, "a", 1))
    assert noise_seed(3, "a", 0) != noise_seed(3, "b", 0)


def test_one_robots_failures_stop_its_output_only(lively_tiny):
    loop = _loop(_engine(lively_tiny, 2), ["a", "b"])
    for _ in range(3):
        loop.frame_failed("boom", "b")
    assert loop.robot("b").failures.stopped and not loop.robot("a").failures.stopped
    assert loop.figures(0, "b")["faulted"] and not loop.figures(0, "a")["faulted"]
    with pytest.raises(ValueError, match="no robot 'x'"):
        loop.question_arrived("c", "hi", robot="x")


def test_a_robots_counts_from_two_threads_lose_nothing_in_its_figures_or_the_totals():
    """The frame worker and the executor both count for a robot (refused observations, text
    tokens): every increment shows in the robot's figure and in the node's total."""
    import collections

    from oxygen_ros.core.robot_inputs import RobotInputs

    total = collections.Counter()
    robots = [RobotInputs("left", 3, total=total), RobotInputs("right", 3, total=total)]
    n = 20_000

    def count(robot):
        for _ in range(n):
            robot.count["observations_invalid"] += 1
    run_interleaved(*[lambda r=r: count(r) for r in robots for _ in range(2)])
    assert [r.counters["observations_invalid"] for r in robots] == [2 * n, 2 * n]
    assert total["observations_invalid"] == 4 * n

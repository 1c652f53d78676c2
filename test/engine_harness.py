"""Helpers for the engine and scheduler tests (no ROS).

* :func:`scene_observations` - observations of random scenes of the synthetic task.
* :func:`run_to_the_end` - observation frames, then language-only frames until every
  request is done, collecting what they produced.
"""

from __future__ import annotations

import numpy as np

from oxygen_ros.core.observation import Observation
from oxygen_ros.core.sim.scene import render, sample_scene


def scene_observations(n: int, seed: int = 0) -> list[Observation]:
    rng = np.random.default_rng(seed)
    scenes = [sample_scene(rng) for _ in range(n)]
    return [Observation({"base": render(s, 32)}, s.instruction, s.state) for s in scenes]


def run_to_the_end(engine, observations, events: list, finished: list) -> None:
    """One frame per observation (each must give its chunk), then language-only frames
    until no request is active or queued; appends every token event and finished request."""
    for o in observations:
        res = engine.step([o])
        assert len(res.actions) == 1, "the frames after a failure act again"
        events += res.tokens
        finished += res.finished
    while engine.active_requests or engine.queued_requests:
        res = engine.step()
        events += res.tokens
        finished += res.finished

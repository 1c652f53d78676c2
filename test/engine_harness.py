"""Helpers for the model, checkpoint, engine and scheduler tests (no ROS).

* :func:`prefix_batch` / :func:`cached_outputs` - a random prefix batch, and what a model's
  cached operations make of it (to compare two copies of a model).
* :func:`stats_dict` - random normalisation statistics.
* :func:`scene_observations` - observations of random scenes of the synthetic task.
* :func:`run_to_the_end` - observation frames, then language-only frames until every
  request is done, collecting what they produced.
* :func:`frames_with_questions` - one observation and at most one question a frame: what
  compiled and eager engines are compared on.
* :func:`run_interleaved` - run functions on threads that switch as often as they can.
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import torch

from oxygen_ros.core.model.cache import SlotView
from oxygen_ros.core.model.vla import PrefixBatch
from oxygen_ros.core.observation import Observation
from oxygen_ros.core.sim.scene import render, sample_scene


def scene_observations(n: int, seed: int = 0) -> list[Observation]:
    rng = np.random.default_rng(seed)
    scenes = [sample_scene(rng) for _ in range(n)]
    return [Observation({"base": render(s, 32)}, s.instruction, s.state) for s in scenes]


def frames_with_questions(engine, lengths: list[int], image_size: int) -> tuple[list, list, list]:
    """One frame per item of ``lengths``, each with one synthetic observation and a question of
    ``lengths[f]`` tokens (0: none); (every chunk, every (request, token), every decode batch size)."""
    from oxygen_ros.core.benchmark import synthetic_observations
    from oxygen_ros.core.engine import Question

    obs = synthetic_observations(len(lengths), image_size, seed=5)
    actions, tokens, batches = [], [], []
    for f, n in enumerate(lengths):
        res = engine.step([obs[f]], [Question("", max_tokens=n)] if n else [])
        actions += res.actions
        tokens += [(e.request_id, e.token_id) for e in res.tokens]
        batches += res.batch_sizes
    return actions, tokens, batches


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


def prefix_batch(config, lengths, *, seed=0):
    g = torch.Generator().manual_seed(seed)
    b, cams, size = len(lengths), config.max_cameras, config.vision.image_size
    pixels = torch.rand(b, cams, 3, size, size, generator=g) * 2 - 1
    tokens = torch.randint(1, config.vocab_size, (b, config.max_token_len), generator=g)
    mask = torch.arange(config.max_token_len)[None] < torch.tensor(lengths)[:, None]
    return PrefixBatch(pixels, torch.ones(b, cams, dtype=torch.bool), tokens * mask, mask)


def cached_outputs(model, *, seed=0, config=None):
    """Prefill logits and denoised actions through the cached ops, with the batch and noise
    sizes of ``config`` (default: the model's own)."""
    c = config or model.config
    batch = prefix_batch(c, [5, c.max_token_len - 3], seed=seed)
    cache = model.new_cache(slots=2, max_len=c.prefix_len + 8)
    res = model.prefill(batch, cache, [[0], [1]])
    noise = torch.randn(2, c.action_horizon, c.action_dim, generator=torch.Generator().manual_seed(seed + 1))
    actions = model.denoise(cache, SlotView.of(0, res.lengths.tolist()), noise, steps=3)
    return res.logits.float(), actions.float()


def stats_dict(dim=7, seed=0):
    rng = np.random.default_rng(seed)
    q01 = rng.uniform(-2, 0, dim)
    return {"mean": rng.normal(size=dim).tolist(), "std": rng.uniform(0.5, 2, dim).tolist(),
            "q01": q01.tolist(), "q99": (q01 + rng.uniform(0.5, 3, dim)).tolist()}


def run_interleaved(*targets) -> None:
    """Run each of ``targets`` on a thread of its own, until all end, with the interpreter
    switching threads as often as it can (so that a race in shared state shows)."""
    threads = [threading.Thread(target=target) for target in targets]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)

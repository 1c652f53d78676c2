"""The training-only patch losses (shape, target): their targets, their heads and how training uses them."""

import numpy as np
import pytest
import torch

from oxygen_ros.core import training, training_loss
from oxygen_ros.core.model.config import TINY
from oxygen_ros.core.model.vla import build_model
from oxygen_ros.core.patch_loss import PatchHead, patch_loss
from oxygen_ros.core.sim import scene as sim
from oxygen_ros.core.sim.patch_coverage import CLASSES, shape_coverage, target_coverage
from oxygen_ros.core.tokenizer import Tokenizer


def test_coverage_names_the_shape_under_each_patch():
    # A circle (6 px radius) centred where patches (2|3, 2|3) of a 6x6 grid (48 px, patch 8) meet: a quarter
    # of it (28 of 64 px) in each; a triangle centred in patch (1, 1).
    scene = sim.Scene((sim.SceneObject("red", "circle", (0.0, 0.0)), sim.SceneObject("red", "triangle", (-0.6, -0.6))),
                      target_index=0, gripper=(0.8, 0.8))
    cover = shape_coverage(scene, 48, 8)
    assert cover.shape == (36, len(CLASSES))
    np.testing.assert_allclose(cover.sum(1), 1.0, atol=1e-6)
    grid = cover.reshape(6, 6, -1)
    circle, triangle = 1 + sim.SHAPES.index("circle"), 1 + sim.SHAPES.index("triangle")
    for r, c in ((2, 2), (2, 3), (3, 2), (3, 3)):
        assert grid[r, c, circle] > 0.4 and grid[r, c, triangle] == 0
    assert grid[1, 1, triangle] > 0.4 and grid[1, 1, circle] == 0
    assert grid[5, 5, 0] == 1.0  # the gripper is not an object
    on_target = target_coverage(scene, 48, 8).reshape(6, 6, 2)
    np.testing.assert_allclose(on_target[..., 1], grid[..., circle])  # the target is the circle
    np.testing.assert_allclose(on_target.sum(-1), 1.0, atol=1e-6)
    with pytest.raises(ValueError, match="multiple"):
        shape_coverage(scene, 48, 7)


def test_head_learns_from_the_loss_and_a_perfect_guess_scores_one():
    head = PatchHead(8, len(CLASSES), seed=0)
    cover = torch.tensor([[[1.0, 0, 0, 0], [0.2, 0.8, 0, 0], [0.4, 0, 0, 0.6]]])
    tokens = torch.randn(1, 3, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
    loss, _ = patch_loss(head, tokens, cover)
    loss.backward()
    assert tokens.grad.abs().sum() > 0 and head.proj.weight.grad.abs().sum() > 0
    with torch.no_grad():
        head.proj.weight.zero_()
        head.proj.bias.copy_(torch.tensor([0.0, 0, 0, 0]))
        head.proj.weight[:, :4] = 50 * torch.eye(4)
    _, acc = patch_loss(head, cover.clone().repeat(1, 1, 2), cover)
    assert acc == 1.0  # the two object patches (the first is background and not counted)


def test_batches_carry_coverage_only_when_the_loss_is_on():
    tok = Tokenizer.default()
    off = dict(patch_shape_weight=0.0, patch_target_weight=0.0)
    plain = training.BatchSource(training.TrainConfig(batch_size=3, seed=2, **off), TINY, tok).get(0)
    assert plain.patch_shapes is None and plain.patch_target is None
    for on in (dict(patch_shape_weight=1.0), dict(patch_target_weight=1.0)):
        batch = training.BatchSource(training.TrainConfig(batch_size=3, seed=2, **{**off, **on}), TINY, tok).get(0)
        assert batch.patch_shapes.shape == (3, TINY.vision.tokens_per_image, len(CLASSES))
        assert batch.patch_target.shape == (3, TINY.vision.tokens_per_image, 2)
        assert torch.equal(batch.prefix.pixels, plain.prefix.pixels) and torch.equal(batch.targets, plain.targets)


def test_loss_reaches_the_vision_tower_and_training_stays_deterministic():
    tok = Tokenizer.default()
    cfg = training.TrainConfig(batch_size=3, seed=2, patch_shape_weight=1.0)
    batch = training.BatchSource(cfg, TINY, tok).get(0)
    model = build_model(TINY, seed=0)
    shape, target = PatchHead(TINY.vlm.width, len(CLASSES), 0), PatchHead(TINY.vlm.width, 2, 1)
    out = training_loss.losses(model, batch, torch.Generator().manual_seed(0), 0.1, shape, target)
    out["patch_shape"].backward(retain_graph=True)
    assert model.vision.tower.embeddings.patch_embedding.weight.grad.abs().sum() > 0
    emb = model.language_model.embed_tokens.weight
    assert emb.grad is None or emb.grad.abs().sum() == 0  # the shape loss sees no text
    model.zero_grad()
    out["patch_target"].backward()
    assert emb.grad.abs().sum() > 0  # the target loss reads the instruction

    cfg = training.TrainConfig(steps=3, batch_size=4, seed=5, warmup_steps=1, patch_shape_weight=1.0,
                               patch_target_weight=1.0)
    with torch.random.fork_rng(devices=[]):
        a, history = training.train(TINY, cfg, tok)
        b, _ = training.train(TINY, cfg, tok)
        c, _ = training.train(TINY, training.TrainConfig(steps=3, batch_size=4, seed=5, warmup_steps=1,
                                                         patch_shape_weight=0.0, patch_target_weight=0.0), tok)
    assert {"patch_shape", "patch_shape_acc", "patch_target", "patch_target_acc"} <= history[-1].keys()
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert sa.keys() == sc.keys()  # the head is not part of the model
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)

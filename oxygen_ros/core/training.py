"""Training the VLA on the synthetic reach task, through the model code that serves.

One example is one joint sequence (prefix, description tokens, action tokens) trained with text
cross-entropy and flow matching in one forward: see :mod:`oxygen_ros.core.training_loss`. Here: the
configuration, the batches (:func:`batch_examples`, :class:`BatchSource`) and the optimisation loop.

Actions are trained normalised: the expert's displacements divided by
``max_step`` (so each lies in ``[-1, 1]``); :func:`norm_stats` writes that
scaling in openpi's ``norm_stats.json`` format, chosen so that z-score and
quantile (q01/q99) normalisation are the same map. The state (gripper ``x, y``
in ``[-1, 1]``) is passed through unchanged (identity statistics) into the
prompt's 256-bin discretisation.

Everything is deterministic for a seed (data, initialisation, noise and flow
times each come from their own seeded generator) at a fixed thread count.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch

from .model.config import ModelConfig
from .model.vla import VLA, PrefixBatch, build_model
from .observation import resize_with_pad
from .model.vision import images_to_pixels
from . import sim
from .sim import questions
from .sim.patch_coverage import CLASSES, shape_coverage, target_coverage
from .patch_loss import PatchHead
from .tokenizer import Tokenizer, tokenize_prompt
from .training_loss import TrainBatch, losses

#: Training data seeds must stay below this; evaluation scenes use seeds from here on.
EVAL_SEED_BASE = 1_000_000


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 10500  # optimiser steps (one batch each)
    batch_size: int = 64  # examples per batch
    lr: float = 2e-3  # AdamW peak learning rate, reached after the warm-up
    min_lr_fraction: float = 0.05  # the cosine decay ends at this fraction of lr
    warmup_steps: int = 200  # linear warm-up from lr / warmup_steps
    weight_decay: float = 0.01  # AdamW decay of the matrices (not of embeddings, norms, biases)
    grad_clip: float = 1.0  # gradient norm clipped to this
    seed: int = 0  # data, initialisation, noise and flow times; below EVAL_SEED_BASE
    text_weight: float = 1.0  # weight of the description's cross-entropy
    action_weight: float = 1.5  # weight of the flow-matching loss
    pad_action_weight: float = 0.1  # weight of the padded action dims' velocity loss
    at_target_prob: float = 0.1  # fraction of examples with the gripper already on the target
    object_weights: tuple[float, float, float] = (0.2, 0.4, 0.4)  # P(1, 2, 3 objects): grounding needs 2-3
    same_colour_prob: float = 0.5  # share of multi-object scenes with a distractor of the target's colour ...
    hard_from: float = 0.3  # ... from this fraction of the steps on (first learn the task, then shapes)
    hires_prob: float = 0.1  # fraction rendered at another size and resized (as another camera is)
    question_prob: float = 0.35  # fraction of examples that ask a question (sim.questions) instead of describing
    question_at_target_prob: float = 0.5  # of the at_target questions, the share asked with the gripper on it
    question_kind_weights: tuple[float, ...] = (1.0, 1.0, 2.0, 1.0)  # P(kind) over sim.questions.KINDS: count is hardest
    max_step: float = sim.MAX_STEP
    patch_shape_weight: float = 1.0  # weight of the auxiliary patch-shape loss (0: off; patch_loss.py)
    patch_target_weight: float = 1.0  # weight of the auxiliary patch-target loss (0: off; patch_loss.py)

    def __post_init__(self) -> None:
        if not 0 <= self.seed < EVAL_SEED_BASE:
            raise ValueError(f"seed must be in [0, {EVAL_SEED_BASE}) (higher seeds are held out for evaluation)")
        if self.steps < 0 or self.batch_size <= 0 or not self.lr > 0 or not math.isfinite(self.lr):
            raise ValueError(f"steps must be >= 0, batch_size and lr > 0 (finite), got {self.steps}, "
                             f"{self.batch_size}, {self.lr}")
        for name in ("patch_shape_weight", "patch_target_weight"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"{name} must be a finite number >= 0 (0: off), got {getattr(self, name)}")
        if len(self.question_kind_weights) != len(questions.KINDS) or min(self.question_kind_weights) < 0 \
                or sum(self.question_kind_weights) <= 0:
            raise ValueError(f"question_kind_weights needs {len(questions.KINDS)} weights >= 0 (one per kind of "
                             f"{list(questions.KINDS)}) with a positive sum, got {self.question_kind_weights}")


# --------------------------------------------------------------------------
# Normalisation
# --------------------------------------------------------------------------


def norm_stats(max_step: float = sim.MAX_STEP) -> dict:
    """openpi-style statistics: actions scaled by ``max_step``, state unchanged.

    ``mean = 0``, ``std = q99 = -q01 = scale``: both openpi normalisations
    (``(x - mean) / std`` and ``2 (x - q01) / (q99 - q01) - 1``) divide by ``scale``.
    The ``oxygen_ros`` entry makes serving do exactly what training did: the state
    passes through (``identity``: openpi's ``eps`` would move states at a bin edge
    of the prompt into the bin below) and the actions' scale has no ``eps`` added.
    """

    def stats(scale: float, dims: int) -> dict:
        return {"mean": [0.0] * dims, "std": [scale] * dims, "q01": [-scale] * dims, "q99": [scale] * dims}

    return {"norm_stats": {"state": stats(1.0, sim.STATE_DIMS), "actions": stats(float(max_step), sim.ACTION_DIMS)},
            "oxygen_ros": {"mode": "identity", "action_mode": "quantile", "convention": "openpi", "eps": 0.0}}


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------


def batch_examples(cfg: TrainConfig, index: int, image_size: int, horizon: int) -> list[sim.Example]:
    """The examples of training batch ``index``: a pure function of ``(cfg.seed, index)``.

    Like :func:`sim.examples` (gripper anywhere, a share of it already on the
    target), with more multi-object scenes (``object_weights``), and, from
    ``hard_from`` of the steps on, a share of scenes where a distractor has the
    target's colour so that only its shape tells them apart (learned last: the
    task is picked up faster without them); a share of the images is rendered
    at another size and resized the way serving resizes camera images; a share
    of the examples (``question_prob``) asks a question of a random kind
    (:mod:`oxygen_ros.core.sim.questions`) instead of describing the scene. Each
    batch has its own generator, so batches can be made in any order or
    process and the data stay the same.
    """
    return [ex for _, ex in _batch_scenes(cfg, index, image_size, horizon)]


def _batch_scenes(cfg: TrainConfig, index: int, image_size: int, horizon: int) -> list[tuple[sim.Scene, sim.Example]]:
    """The scenes of batch ``index`` and their examples (see :func:`batch_examples`)."""
    rng = np.random.default_rng([cfg.seed, index])
    same_colour_prob = cfg.same_colour_prob if index >= cfg.hard_from * cfg.steps else 0.0
    return [_example(cfg, rng, same_colour_prob, image_size, horizon) for _ in range(cfg.batch_size)]


def _example(cfg: TrainConfig, rng: np.random.Generator, same_colour_prob: float, image_size: int,
             horizon: int) -> tuple[sim.Scene, sim.Example]:
    n_objects = 1 + int(rng.choice(3, p=np.asarray(cfg.object_weights) / sum(cfg.object_weights)))
    scene = sim.sample_scene(rng, n_objects, min_gripper_distance=0.0)
    if n_objects > 1 and rng.random() < same_colour_prob:
        # Hard negatives: only the shape tells the target from a distractor.
        while not _same_colour_distractor(scene):
            scene = sim.sample_scene(rng, n_objects, min_gripper_distance=0.0)
    kind_p = np.asarray(cfg.question_kind_weights) / sum(cfg.question_kind_weights)
    kind = questions.KINDS[int(rng.choice(len(questions.KINDS), p=kind_p))] if rng.random() < cfg.question_prob else None
    near = cfg.question_at_target_prob if kind == "at_target" else cfg.at_target_prob
    if rng.random() < near:
        scene = sim.gripper_near_target(scene, rng)
    ex = sim.make_example(scene, image_size, horizon, cfg.max_step)
    if kind is not None:
        asked = questions.ask(scene, kind, rng)
        ex = ex._replace(question=asked.question, answer=asked.answer)
    if rng.random() < cfg.hires_prob:
        sizes = [n for n in (image_size // 2, 2 * image_size, 3 * image_size, 224) if n >= 32 and n != image_size]
        size = int(rng.choice(sizes))
        ex = ex._replace(image=resize_with_pad(sim.render(scene, size), image_size))
    return scene, ex


def _same_colour_distractor(scene: sim.Scene) -> bool:
    return any(o.colour == scene.target.colour for i, o in enumerate(scene.objects) if i != scene.target_index)


def make_train_batch(examples: list[sim.Example], tokenizer: Tokenizer, config: ModelConfig,
                     max_step: float, scenes: list[sim.Scene] | None = None) -> TrainBatch:
    """The tensors of a batch; with the examples' ``scenes``, also their patches' shape and target coverage."""
    b = len(examples)
    prompts = [tokenize_prompt(tokenizer, ex.instruction, ex.state, config.max_token_len) for ex in examples]
    plen = max(int(m.sum()) for _, m in prompts)
    tokens = torch.from_numpy(np.stack([t[:plen] for t, _ in prompts]))
    token_mask = torch.from_numpy(np.stack([m[:plen] for _, m in prompts]))
    images = np.stack([resize_with_pad(ex.image, config.vision.image_size) for ex in examples])[:, None]
    prefix = PrefixBatch(images_to_pixels(torch.from_numpy(images)), torch.ones(b, 1, dtype=torch.bool),
                         tokens, token_mask)
    text_in, text_mask, targets = text_batch(examples, tokenizer)
    actions = torch.zeros(b, config.action_horizon, config.action_dim)
    acts = torch.from_numpy(np.stack([ex.actions for ex in examples])) / max_step
    actions[:, :, : acts.shape[-1]] = acts
    if scenes is None:
        return TrainBatch(prefix, text_in, text_mask, targets, actions)
    size, patch = config.vision.image_size, config.vision.patch_size
    shapes = torch.from_numpy(np.stack([shape_coverage(s, size, patch) for s in scenes]))
    on_target = torch.from_numpy(np.stack([target_coverage(s, size, patch) for s in scenes]))
    return TrainBatch(prefix, text_in, text_mask, targets, actions, shapes, on_target)


def text_batch(examples: list[sim.Example], tokenizer: Tokenizer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The text part of a batch: tokens fed after the prompt ``[B, D]``, their mask, and the targets
    ``[B, D + 1]`` (-100: no loss).

    A description is fed as its tokens and predicted whole, then EOS. A question is fed first, as
    serving appends it after the prompt (``tokenizer.encode(question)``, no BOS), and only its
    answer and EOS are predicted, the answer's first token from the question's last one.
    """
    asked = [tokenizer.encode(ex.question) if ex.question else [] for ex in examples]
    said = [tokenizer.encode(ex.text) for ex in examples]
    b, d = len(examples), max(len(q) + len(t) for q, t in zip(asked, said))
    text_in = torch.zeros(b, d, dtype=torch.long)
    text_mask = torch.zeros(b, d, dtype=torch.bool)
    targets = torch.full((b, d + 1), -100, dtype=torch.long)
    for i, (q, t) in enumerate(zip(asked, said)):
        ids = q + t
        text_in[i, : len(ids)] = torch.tensor(ids)
        text_mask[i, : len(ids)] = True
        targets[i, len(q) : len(ids) + 1] = torch.tensor(t + [tokenizer.eos_id])
    return text_in, text_mask, targets


class BatchSource:
    """Training batches ``0, 1, 2, ...`` in order.

    With ``workers > 0`` they are made in that many processes, at most
    ``prefetch`` ahead of use, so rendering overlaps the optimiser step; the
    batches are the same either way (see :func:`batch_examples`).
    """

    def __init__(self, cfg: TrainConfig, model_config: ModelConfig, tokenizer: Tokenizer, *, workers: int = 0,
                 prefetch: int = 4):
        self._args = (cfg, model_config, str(tokenizer.path))
        self._tokenizer = tokenizer
        self._pool = None
        self._pending: dict[int, object] = {}
        self._prefetch = max(1, prefetch)
        if workers > 0:
            import multiprocessing

            ctx = multiprocessing.get_context("spawn")  # no fork of a process that holds torch's thread pools
            self._pool = ctx.Pool(workers, initializer=_worker_init, initargs=self._args)

    def get(self, index: int) -> TrainBatch:
        if self._pool is None:
            return _make_batch(*self._args[:2], self._tokenizer, index)
        for i in range(index, index + self._prefetch):
            if i not in self._pending:
                self._pending[i] = self._pool.apply_async(_worker_batch, (i,))
        return self._pending.pop(index).get()

    def close(self, *, graceful: bool = True) -> None:
        """Stop the workers. ``graceful``: let the prefetched batches finish first, as
        ``terminate()`` with results outstanding can fail inside CPython's Pool ("Cannot
        have cache with result_hander not alive", a race seen in the test suite); after
        an error (a worker may have died with its task) the pool is terminated."""
        if self._pool is None:
            return
        pool, self._pool = self._pool, None
        self._pending.clear()
        if graceful:
            pool.close()
        else:
            try:
                pool.terminate()
            except AssertionError:  # that race: the workers are gone all the same
                pass
        pool.join()

    def __enter__(self) -> "BatchSource":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(graceful=exc_type is None)


def _make_batch(cfg: TrainConfig, model_config: ModelConfig, tokenizer: Tokenizer, index: int) -> TrainBatch:
    pairs = _batch_scenes(cfg, index, model_config.vision.image_size, model_config.action_horizon)
    scenes = [s for s, _ in pairs] if cfg.patch_shape_weight > 0 or cfg.patch_target_weight > 0 else None
    return make_train_batch([ex for _, ex in pairs], tokenizer, model_config, cfg.max_step, scenes)


_WORKER: dict = {}


def _worker_init(cfg: TrainConfig, model_config: ModelConfig, tokenizer_path: str) -> None:
    torch.set_num_threads(1)
    _WORKER.update(cfg=cfg, model_config=model_config, tokenizer=Tokenizer(tokenizer_path))


def _worker_batch(index: int) -> TrainBatch:
    return _make_batch(_WORKER["cfg"], _WORKER["model_config"], _WORKER["tokenizer"], index)


# --------------------------------------------------------------------------
# Loop
# --------------------------------------------------------------------------


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to ``min_lr_fraction * lr``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.min_lr_fraction
    return cfg.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def _init_for_training(model: VLA, seed: int) -> None:
    """Token embeddings at std 1/sqrt(width) (Gemma scales them up by sqrt(width) on
    input, and the LM head is tied to them, so the first logits are O(1))."""
    emb = model.language_model.embed_tokens.weight
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        emb.copy_(torch.randn(emb.shape, generator=gen, dtype=torch.float32).to(emb.dtype) * emb.shape[1] ** -0.5)


def train(
    model_config: ModelConfig,
    cfg: TrainConfig,
    tokenizer: Tokenizer,
    *,
    log: Callable[[dict], None] | None = None,
    log_every: int = 100,
    workers: int = 0,
) -> tuple[VLA, list[dict]]:
    """Train a freshly initialised model; returns it (in eval mode) and the logged history."""
    if tokenizer.vocab_size != model_config.vocab_size:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} pieces, model expects {model_config.vocab_size}")
    model = build_model(model_config, seed=cfg.seed)
    _init_for_training(model, cfg.seed)
    model.train()
    # The auxiliary heads train with the model and are dropped at the end (never exported).
    width = model_config.vlm.width
    heads = {"shape": PatchHead(width, len(CLASSES), cfg.seed + 2) if cfg.patch_shape_weight > 0 else None,
             "target": PatchHead(width, 2, cfg.seed + 3) if cfg.patch_target_weight > 0 else None}
    params = list(model.named_parameters())
    params += [p for head in heads.values() if head is not None for p in head.named_parameters()]
    decay = [p for n, p in params if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in params if not (p.ndim >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(cfg.seed)
    history: list[dict] = []
    running: dict[str, float] = {}
    start = time.perf_counter()
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    with BatchSource(cfg, model_config, tokenizer, workers=workers) as data:
        try:
            for step in range(cfg.steps):
                _step(model, heads, opt, data.get(step), gen, step, cfg, running)
                if (step + 1) % log_every == 0 or step + 1 == cfg.steps:
                    n = (step % log_every) + 1
                    entry = {"step": step + 1, "lr": round(lr_at(step, cfg), 7),
                             "elapsed_s": round(time.perf_counter() - start, 1),
                             **{k: round(v / n, 5) for k, v in running.items()}}
                    running.clear()
                    history.append(entry)
                    if log is not None:
                        log(entry)
        finally:
            torch.use_deterministic_algorithms(deterministic)
    model.eval()
    return model, history


def _step(model: VLA, heads: dict[str, PatchHead | None], opt: torch.optim.Optimizer, batch: TrainBatch,
          gen: torch.Generator, step: int, cfg: TrainConfig, running: dict[str, float]) -> None:
    for group in opt.param_groups:
        group["lr"] = lr_at(step, cfg)
    out = losses(model, batch, gen, cfg.pad_action_weight, heads["shape"], heads["target"])
    loss = cfg.text_weight * out["text"] + cfg.action_weight * out["action_total"]
    if heads["shape"] is not None:
        loss = loss + cfg.patch_shape_weight * out["patch_shape"]
    if heads["target"] is not None:
        loss = loss + cfg.patch_target_weight * out["patch_target"]
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    for head in heads.values():
        if head is not None:
            torch.nn.utils.clip_grad_norm_(head.parameters(), cfg.grad_clip)
    opt.step()
    for k in ("text", "action", "action_pad", "seq_acc", "patch_shape", "patch_shape_acc", "patch_target",
              "patch_target_acc"):
        if k in out:
            running[k] = running.get(k, 0.0) + float(out[k].detach())


def config_dict(cfg: TrainConfig) -> dict:
    return asdict(cfg)


__all__ = ["TrainConfig", "norm_stats", "batch_examples", "BatchSource", "make_train_batch", "text_batch", "train",
           "lr_at",
           "EVAL_SEED_BASE"]

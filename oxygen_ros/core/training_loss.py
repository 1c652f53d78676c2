"""The training loss: text cross-entropy and flow matching over one joint sequence per example.

One example is one joint sequence, run with :func:`~.model.joint.forward_joint`::

    [ base image + prompt (prefix) | description tokens (text) | action tokens ]

* the prefix (the ``base`` camera's patches and the π0.5 prompt with the
  binned state) attends bidirectionally to its valid tokens;
* the text tokens attend to the prefix and causally to each other; the
  description ``describe(scene)`` + EOS is predicted with cross-entropy, its
  first token from the last prompt position (as greedy decoding after
  ``prefill`` reads it);
* the action tokens attend to the prefix and to each other, never to the text,
  and learn π0.5's flow matching: ``x_t = t * noise + (1 - t) * actions``,
  target ``u = noise - actions``, ``t ~ Beta(1.5, 1) * 0.999 + 0.001``, loss
  ``MSE(v, u)``.

Positions are ``cumsum(valid) - 1`` over prefix and text, and the action tokens
start right after the valid prefix, exactly as the cached ``prefill`` /
``decode_step`` / ``denoise`` number them; since the prefix never sees the text
or the actions and the actions never see the text, one forward trains both
serving paths at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .model.joint import forward_joint
from .model.vla import VLA, PrefixBatch
from .patch_loss import PatchHead, patch_loss
from .sim import ACTION_DIMS


@dataclass(frozen=True)
class TrainBatch:
    prefix: PrefixBatch  # one camera (base), prompt padded to the batch's longest
    text_in: Tensor  # [B, D] description tokens fed to the model (pad 0)
    text_mask: Tensor  # [B, D] bool
    targets: Tensor  # [B, D + 1] next-token targets, -100 on padding
    actions: Tensor  # [B, H, action_dim] normalised, zero-padded
    patch_shapes: Tensor | None = None  # [B, N, 4] shape coverage of the image's patches (auxiliary losses only)
    patch_target: Tensor | None = None  # [B, N, 2] target coverage of the image's patches (auxiliary losses only)


def sample_time(b: int, generator: torch.Generator) -> Tensor:
    """Flow-matching times as openpi samples them: Beta(1.5, 1) * 0.999 + 0.001."""
    # Beta(1.5, 1) by inverse CDF (F(x) = x ** 1.5), so one seeded generator drives it.
    u = torch.rand(b, generator=generator, dtype=torch.float64)
    return u ** (1.0 / 1.5) * 0.999 + 0.001


def joint_mask(prefix_valid: Tensor, text_valid: Tensor, horizon: int) -> Tensor:
    """allowed [B, T, T] over [prefix | text | actions] (see the module docstring)."""
    b, p = prefix_valid.shape
    d = text_valid.shape[1]
    ones = torch.ones(b, horizon, dtype=torch.bool)
    zeros_p, zeros_d = torch.zeros_like(prefix_valid), torch.zeros_like(text_valid)
    is_prefix = torch.cat([torch.ones_like(prefix_valid), zeros_d, ~ones], 1)
    is_text = torch.cat([zeros_p, torch.ones_like(text_valid), ~ones], 1)
    is_action = torch.cat([zeros_p, zeros_d, ones], 1)
    valid = torch.cat([prefix_valid, text_valid, ones], 1)
    idx = torch.arange(p + d + horizon)
    causal = idx[None, :] <= idx[:, None]
    sees_prefix = (is_prefix & valid)[:, None, :]
    text_keys = (is_text & valid)[:, None, :] & causal[None] & is_text[:, :, None]
    action_keys = is_action[:, None, :] & is_action[:, :, None]
    return sees_prefix | text_keys | action_keys


def losses(model: VLA, batch: TrainBatch, generator: torch.Generator, pad_action_weight: float,
           shape_head: PatchHead | None = None, target_head: PatchHead | None = None) -> dict[str, Tensor]:
    """Text cross-entropy and flow-matching MSE of one batch (differentiable); with ``shape_head``, also
    the patch-shape loss on the vision tower's tokens, with ``target_head`` the patch-target loss on the
    VLM's last-layer image tokens (:mod:`oxygen_ros.core.patch_loss`)."""
    x_p, valid_p = model.embed_prefix(batch.prefix)
    b, p, _ = x_p.shape
    x_txt = model.language_model.embed(batch.text_in).to(x_p.dtype)
    vlm_x = torch.cat([x_p, x_txt], 1)
    vlm_valid = torch.cat([valid_p, batch.text_mask], 1)
    vlm_pos = vlm_valid.long().cumsum(1) - 1
    prefix_len = valid_p.sum(1)
    horizon = batch.actions.shape[1]
    act_pos = prefix_len[:, None] + torch.arange(horizon)

    actions = batch.actions.to(model.action_dtype)
    noise = torch.randn(actions.shape, generator=generator, dtype=torch.float32).to(model.action_dtype)
    t = sample_time(b, generator)
    tt = t.to(model.action_dtype)[:, None, None]
    x_t = tt * noise + (1 - tt) * actions
    u = noise - actions

    allowed = joint_mask(valid_p, batch.text_mask, horizon)
    h_vlm, h_act = forward_joint(model, vlm_x, vlm_pos, model.embed_actions(x_t), act_pos,
                                       model.time_condition(t), allowed)
    v = model.actions_out(h_act)

    # Logit rows: the last valid prompt token predicts the first description
    # token, then each description token predicts the next (the last one EOS).
    last_prompt = (valid_p.long() * torch.arange(p)).amax(1)
    rows = torch.cat([last_prompt[:, None], p + torch.arange(batch.text_in.shape[1]).expand(b, -1)], 1)
    h_rows = torch.gather(h_vlm, 1, rows[..., None].expand(-1, -1, h_vlm.shape[-1]))
    logits = model.language_model.logits(h_rows).float()
    text = F.cross_entropy(logits.flatten(0, 1), batch.targets.flatten(), ignore_index=-100)

    err = (v - u).float().pow(2)
    real = err[..., :ACTION_DIMS].mean()
    pad = err[..., ACTION_DIMS:].mean() if err.shape[-1] > ACTION_DIMS else err.new_zeros(())
    with torch.no_grad():
        hits = (logits.argmax(-1) == batch.targets) | (batch.targets == -100)
        seq_acc = hits.all(1).float().mean()
    out = {"text": text, "action": real, "action_pad": pad, "seq_acc": seq_acc,
           "action_total": real + pad_action_weight * pad}
    n = model.config.vision.tokens_per_image  # one camera: the prefix starts with its n image tokens
    if shape_head is not None:
        out["patch_shape"], out["patch_shape_acc"] = patch_loss(shape_head, x_p[:, :n], batch.patch_shapes)
    if target_head is not None:
        out["patch_target"], out["patch_target_acc"] = patch_loss(target_head, h_vlm[:, :n], batch.patch_target)
    return out

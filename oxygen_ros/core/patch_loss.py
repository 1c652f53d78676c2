"""Auxiliary training losses on the image tokens: what covers each patch.

A linear head over image tokens predicts, per patch, the fractions of it that
some classes cover, with a soft-target cross-entropy
(:mod:`oxygen_ros.core.sim.patch_coverage` makes the targets):

* on the tokens the vision tower hands the VLM, which shape covers the patch
  (:func:`~oxygen_ros.core.sim.patch_coverage.shape_coverage`). Colour the tokens
  carry anyway, while telling a circle from a square a few patches across is
  what the task's same-colour scenes need and what the text and action losses
  teach slowly;
* on the VLM's last-layer image tokens (which see the instruction), whether the
  patch is on the target (:func:`~oxygen_ros.core.sim.patch_coverage.target_coverage`).

Heads train alongside the model and are thrown away: no part of the exported
checkpoint.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class PatchHead(nn.Module):
    """Linear ``width -> classes``, initialised from its own seeded generator."""

    def __init__(self, width: int, classes: int, seed: int):
        super().__init__()
        self.proj = nn.Linear(width, classes)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            self.proj.weight.copy_(torch.randn(self.proj.weight.shape, generator=gen) * width ** -0.5)
            self.proj.bias.zero_()

    def forward(self, tokens: Tensor) -> Tensor:
        return self.proj(tokens.float())


def patch_loss(head: PatchHead, image_tokens: Tensor, coverage: Tensor) -> tuple[Tensor, Tensor]:
    """Soft-target cross-entropy of ``head(image_tokens)`` [B, N, W] against ``coverage`` [B, N, C]
    (column 0: nothing of interest), and (no gradient) over the patches something of interest covers
    at least half of, the share whose most-covered class the head names."""
    logits = head(image_tokens)
    loss = -(coverage * torch.log_softmax(logits, -1)).sum(-1).mean()
    with torch.no_grad():
        covered = coverage[..., 0] <= 0.5
        hits = (logits.argmax(-1) == coverage.argmax(-1)) & covered
        acc = hits.sum().float() / covered.sum().clamp(min=1)
    return loss, acc

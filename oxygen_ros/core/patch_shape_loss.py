"""An auxiliary training loss: each image token says which shape covers its patch.

A linear head over the image tokens the vision tower hands the VLM predicts the
patch's shape coverage (:func:`oxygen_ros.core.sim.patch_shapes.shape_coverage`)
with a soft-target cross-entropy. Only shape is asked for: colour the tokens
carry anyway, while telling a circle from a square a few patches across is what
the task's same-colour scenes need and what the text and action losses teach
slowly. The head is trained alongside the model and thrown away; it is no part
of the exported checkpoint.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .sim.patch_shapes import CLASSES


class PatchShapeHead(nn.Module):
    """Linear ``width -> len(CLASSES)``, initialised from its own seeded generator."""

    def __init__(self, width: int, seed: int):
        super().__init__()
        self.proj = nn.Linear(width, len(CLASSES))
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            self.proj.weight.copy_(torch.randn(self.proj.weight.shape, generator=gen) * width ** -0.5)
            self.proj.bias.zero_()

    def forward(self, tokens: Tensor) -> Tensor:
        return self.proj(tokens.float())


def patch_shape_loss(head: PatchShapeHead, image_tokens: Tensor, coverage: Tensor) -> tuple[Tensor, Tensor]:
    """Soft-target cross-entropy of ``head(image_tokens)`` [B, N, W] against ``coverage`` [B, N, C],
    and (no gradient) over the patches an object covers at least half of, the share whose shape the
    head names."""
    logits = head(image_tokens)
    loss = -(coverage * torch.log_softmax(logits, -1)).sum(-1).mean()
    with torch.no_grad():
        on_object = coverage[..., 0] <= 0.5
        hits = (logits.argmax(-1) == coverage.argmax(-1)) & on_object
        acc = hits.sum().float() / on_object.sum().clamp(min=1)
    return loss, acc

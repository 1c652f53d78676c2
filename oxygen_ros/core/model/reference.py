"""Uncached reference computations, written the way π0.5 states them.

They work on the padded prefix (pad tokens in place, positions = cumulative
count of valid tokens) and recompute everything at every step. They are slow
on purpose: the cached, compacted paths of :class:`VLA` are tested against
them, and training uses the same masks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .flow_time import flow_times
from .joint import forward_joint
from .vla import VLA, PrefixBatch


def prefix_positions(valid: Tensor) -> Tensor:
    return valid.long().cumsum(dim=1) - 1


@torch.inference_mode()
def reference_actions(model: VLA, batch: PrefixBatch, noise: Tensor, steps: int) -> Tensor:
    """One joint forward of prefix + action tokens per Euler step, no cache."""
    x_p, valid = model.embed_prefix(batch)
    b, p, _ = x_p.shape
    horizon = noise.shape[1]
    lengths = valid.sum(dim=1)
    pos_p = prefix_positions(valid)
    pos_a = lengths[:, None] + torch.arange(horizon)
    key_valid = torch.cat([valid, torch.ones(b, horizon, dtype=torch.bool)], dim=1)  # [B, P+H]
    is_action_key = torch.cat([torch.zeros(b, p, dtype=torch.bool), torch.ones(b, horizon, dtype=torch.bool)], 1)
    is_action_query = is_action_key
    # prefix queries see valid prefix keys; action queries see valid prefix keys and all actions
    allowed = key_valid[:, None, :] & (is_action_query[:, :, None] | ~is_action_key[:, None, :])
    x_t = noise.to(model.action_dtype)
    times, dt = flow_times(steps)
    for step in range(steps):
        t = times[step].expand(b)
        cond = model.time_condition(t)
        _, h = forward_joint(model, x_p, pos_p, model.embed_actions(x_t), pos_a, cond, allowed)
        x_t = x_t + dt * model.actions_out(h)
    return x_t


@torch.inference_mode()
def reference_generate(
    model: VLA, batch: PrefixBatch, max_new: int | Sequence[int], eos_id: int | None = None
) -> tuple[list[list[int]], list[Tensor]]:
    """Greedy decoding that recomputes the whole sequence for every token.

    ``max_new`` may differ per row. Returns the tokens of each row and the
    logits [n, vocab] each token was chosen from.
    """
    x_p, valid = model.embed_prefix(batch)
    limits = [max_new] * batch.size if isinstance(max_new, int) else list(max_new)
    out: list[list[int]] = []
    all_logits: list[Tensor] = []
    for r in range(batch.size):
        xr, vr = x_p[r : r + 1], valid[r : r + 1]
        p = xr.shape[1]
        n_valid = int(vr.sum())
        last = int(torch.nonzero(vr[0])[-1])
        tokens: list[int] = []
        row_logits: list[Tensor] = []
        while len(tokens) < limits[r]:
            d = len(tokens)
            if d:
                emb = model.language_model.embed(torch.tensor([tokens])).to(model.dtype)
                x = torch.cat([xr, emb], dim=1)
            else:
                x = xr
            key_valid = torch.cat([vr, torch.ones(1, d, dtype=torch.bool)], dim=1)
            q_idx = torch.arange(p + d)
            causal = (q_idx[None, :] <= q_idx[:, None]) | (q_idx[None, :] < p)  # decoded keys causal
            prefix_q = q_idx[:, None] < p
            allowed = key_valid[:, None, :] & causal[None] & ~(prefix_q & (q_idx[None, :] >= p))[None]
            pos = torch.cat([prefix_positions(vr), n_valid + torch.arange(d)[None]], dim=1)
            h, _ = forward_joint(model, x, pos, None, None, None, allowed)
            at = last if d == 0 else p + d - 1
            logits = model.language_model.logits(h[0, at]).float()
            token = int(logits.argmax())
            tokens.append(token)
            row_logits.append(logits)
            if eos_id is not None and token == eos_id:
                break
        out.append(tokens)
        all_logits.append(torch.stack(row_logits) if row_logits else torch.zeros(0))
    return out, all_logits

"""The uncached joint forward of the VLM and the action expert under one attention mask.

Training runs it over whole examples (prefix, description and noised actions in one
sequence), and ``reference.py`` over each step of its slow reference paths: the cached
operations of :class:`~.vla.VLA` are tested against it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .gemma import attend, attention_bias, rope, rotary
from .vla import VLA


def forward_joint(model: VLA, vlm_x: Tensor | None, vlm_positions: Tensor | None, expert_x: Tensor | None,
                  expert_positions: Tensor | None, cond: Tensor | None,
                  allowed: Tensor) -> tuple[Tensor | None, Tensor | None]:
    """Both streams of ``model`` (either may be None) through every layer, attending jointly.

    ``allowed`` [B, Tv + Te, Tv + Te] over the concatenated sequence (VLM tokens first);
    ``cond`` conditions the expert's adaptive norms. Returns the final-normed hidden
    states of each stream (None for a stream not given)."""
    c = model.config
    streams = [(stack, x, p) for stack, x, p in ((model.language_model, vlm_x, vlm_positions),
                                                 (model.expert, expert_x, expert_positions)) if x is not None]
    conds = [cond if stack is model.expert else None for stack, _, _ in streams]
    xs = [x for _, x, _ in streams]
    tables = [rotary(p, c.vlm.head_dim, c.rope_base, model.dtype) for _, _, p in streams]
    bias = attention_bias(allowed, c.vlm.heads // c.vlm.kv_heads, model.dtype)
    for i in range(c.vlm.depth):
        qs, ks, vs, gates = [], [], [], []
        for (stack, _, _), table, x, s_cond in zip(streams, tables, xs, conds):
            q, k, v, gate = stack.layers[i].pre_attention(x, s_cond)
            qs.append(rope(q, table))
            ks.append(rope(k, table))
            vs.append(v)
            gates.append(gate)
        attn = attend(torch.cat(qs, 2), [(torch.cat(ks, 2), torch.cat(vs, 2), bias)])
        out, start = [], 0
        for (stack, _, _), x, gate, s_cond in zip(streams, xs, gates, conds):
            n = x.shape[1]
            out.append(stack.layers[i].post_attention(x, attn[:, :, start : start + n], gate, s_cond))
            start += n
        xs = out
    result = [stack.norm(x, s_cond)[0] for (stack, _, _), x, s_cond in zip(streams, xs, conds)]
    return (result[0] if vlm_x is not None else None), (result[-1] if expert_x is not None else None)

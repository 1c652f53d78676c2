"""Gemma decoder pieces shared by the VLM and the action expert.

Both stacks are made of :class:`GemmaLayer`; the expert's norms are adaptive
(adaRMS, conditioned on the flow-matching time). A layer does not run
attention itself: the caller (``vla.py``) joins the queries, keys and values of
both stacks, or reads cached keys and values from the KV pool, and hands the
attention output back. Attribute names follow the public checkpoints
(``self_attn.q_proj``, ``mlp.gate_proj``, ``input_layernorm``...).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import GemmaConfig


class RMSNorm(nn.Module):
    """Gemma RMSNorm: ``x / rms(x) * (1 + w)``, computed in float32."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor, cond: Tensor | None = None, modulation: Tensor | None = None) -> tuple[Tensor, None]:
        x32 = _wide(x)
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.to(x32.dtype))).to(x.dtype), None


class AdaRMSNorm(nn.Module):
    """Adaptive RMSNorm: a dense layer of the condition gives scale, shift and gate.

    ``out = norm(x) * (1 + scale) + shift``; the gate multiplies the branch that
    is added back to the residual stream. The dense layer's output depends on the
    condition only: :meth:`modulation` computes it beforehand (the denoise loop
    does, once for all its steps) and ``forward(x, modulation=...)`` uses it.
    """

    def __init__(self, dim: int, cond_dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        # Randomly initialised (not zero as when fine-tuning from a VLM): with a
        # zero gate a fresh expert would ignore the prefix entirely.
        self.dense = nn.Linear(cond_dim, 3 * dim)

    def modulation(self, cond: Tensor) -> Tensor:
        """Scale, shift and gate of conditions ``cond`` [N, C], side by side: [N, 3 * dim]."""
        return self.dense(cond)

    def forward(self, x: Tensor, cond: Tensor | None = None, modulation: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``x`` [B, T, dim] under condition ``cond`` [B or 1, C], or its precomputed ``modulation``."""
        if modulation is None:
            if cond is None:
                raise ValueError("AdaRMSNorm needs a condition (the time embedding)")
            modulation = self.modulation(cond)
        x32 = _wide(x)
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        scale, shift, gate = modulation.to(x32.dtype)[:, None, :].chunk(3, dim=-1)
        return (normed * (1.0 + scale) + shift).to(x.dtype), gate.to(x.dtype)


class GemmaMLP(nn.Module):
    """GeGLU feed-forward: ``down(gelu_tanh(gate(x)) * up(x))``."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(width, hidden, bias=False)
        self.up_proj = nn.Linear(width, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, width, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(gelu_tanh(self.gate_proj(x)) * self.up_proj(x))


#: 2 * sqrt(2 / pi): 0.5 * (1 + tanh(u)) = sigmoid(2 * u)
_GELU_SIGMOID_SCALE = 2.0 * math.sqrt(2.0 / math.pi)


def gelu_tanh(x: Tensor) -> Tensor:
    """GELU, tanh approximation (Gemma's and SigLIP's activation): ``0.5 x (1 + tanh(u))``,
    ``u = sqrt(2/pi) (x + 0.044715 x^3)``.

    Eager it is torch's fused kernel. Traced for compilation (``torch.compile``, ``torch.export``)
    it is written as the same function ``x * sigmoid(2u)``, computed in at least float32: the CPU
    code generator's vectorised ``tanh`` is slow, and π0.5's gated MLP activation (790 x 16384 in
    bfloat16) took 23.7 ms compiled with ``tanh`` against 7.6 ms with ``sigmoid`` on a 2-core
    AVX-512 machine (18.3 ms eager).
    """
    if not torch.compiler.is_compiling():
        return F.gelu(x, approximate="tanh")
    w = _wide(x)
    return (w * torch.sigmoid(_GELU_SIGMOID_SCALE * (w + 0.044715 * w * w * w))).to(x.dtype)


class GeluTanh(nn.Module):
    """:func:`gelu_tanh` as a module (the vision tower's MLP takes its activation as one)."""

    def forward(self, x: Tensor) -> Tensor:
        return gelu_tanh(x)


class SelfAttentionProjections(nn.Module):
    """The four projections of one layer's attention (no biases, as Gemma)."""

    def __init__(self, cfg: GemmaConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.width, cfg.heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.width, cfg.kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.width, cfg.kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.heads * cfg.head_dim, cfg.width, bias=False)

    def qkv(self, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``h`` [B, T, W] -> q [B, H, T, D], k and v [B, KV, T, D]."""
        b, t, _ = h.shape
        q = self.q_proj(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        return q, k, v

    def out(self, attn: Tensor) -> Tensor:
        """``attn`` [B, H, T, D] -> [B, T, W]."""
        b, h, t, d = attn.shape
        return self.o_proj(attn.transpose(1, 2).reshape(b, t, h * d))


class GemmaLayer(nn.Module):
    """One decoder layer, split around attention so two stacks can share it."""

    def __init__(self, cfg: GemmaConfig, cond_dim: int | None, eps: float):
        super().__init__()
        norm = (lambda: AdaRMSNorm(cfg.width, cond_dim, eps)) if cond_dim else (lambda: RMSNorm(cfg.width, eps))
        self.input_layernorm = norm()
        self.self_attn = SelfAttentionProjections(cfg)
        self.post_attention_layernorm = norm()
        self.mlp = GemmaMLP(cfg.width, cfg.mlp)

    def pre_attention(self, x: Tensor, cond: Tensor | None, modulation: Tensor | None = None):
        h, gate = self.input_layernorm(x, cond, modulation)
        q, k, v = self.self_attn.qkv(h)
        return q, k, v, gate

    def post_attention(self, x: Tensor, attn: Tensor, gate: Tensor | None, cond: Tensor | None,
                       modulation: Tensor | None = None) -> Tensor:
        x = _residual(x, self.self_attn.out(attn), gate)
        h, gate = self.post_attention_layernorm(x, cond, modulation)
        return _residual(x, self.mlp(h), gate)


class GemmaStack(nn.Module):
    """A stack of layers and a final norm; the VLM also has the token embedding."""

    def __init__(self, cfg: GemmaConfig, *, vocab_size: int | None, cond_dim: int | None, eps: float):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(vocab_size, cfg.width) if vocab_size else None
        if self.embed_tokens is not None and not self.embed_tokens.weight.is_meta:
            # Random rows of equal norm: with a tied LM head, rows of unequal norm
            # make an untrained model repeat its largest-norm token forever.
            with torch.no_grad():
                w = self.embed_tokens.weight
                w.copy_(w / w.norm(dim=-1, keepdim=True))
        self.layers = nn.ModuleList(GemmaLayer(cfg, cond_dim, eps) for _ in range(cfg.depth))
        self.norm = AdaRMSNorm(cfg.width, cond_dim, eps) if cond_dim else RMSNorm(cfg.width, eps)

    def embed(self, tokens: Tensor) -> Tensor:
        """Text embeddings scaled by sqrt(width), as Gemma does."""
        return self.embed_tokens(tokens) * math.sqrt(self.cfg.width)

    def modulations(self, cond: Tensor) -> tuple[list[tuple[Tensor, Tensor]], Tensor]:
        """Every adaptive norm's :meth:`AdaRMSNorm.modulation` of ``cond`` [N, C]: per layer
        (input, post-attention), and the final norm's; each [N, 3 * width]."""
        layers = [(l.input_layernorm.modulation(cond), l.post_attention_layernorm.modulation(cond))
                  for l in self.layers]
        return layers, self.norm.modulation(cond)

    def logits(self, h: Tensor) -> Tensor:
        """LM head tied to the embedding; ``h`` is already final-normed."""
        return h @ self.embed_tokens.weight.t()


def _wide(x: Tensor) -> Tensor:
    """At least float32 (norms, rotary angles and softmax never run in bf16)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _residual(x: Tensor, y: Tensor, gate: Tensor | None) -> Tensor:
    return x + y if gate is None else x + y * gate


Rotary = tuple[Tensor, Tensor]


def rotary(positions: Tensor, head_dim: int, base: float, dtype: torch.dtype) -> Rotary:
    """cos/sin tables [B, 1, T, D/2] for positions [B, T]; computed once per call, shared by layers."""
    wide = torch.promote_types(dtype, torch.float32)
    inv = base ** (-torch.arange(0, head_dim, 2, device=positions.device, dtype=wide) / head_dim)
    angles = positions.to(wide)[:, None, :, None] * inv
    return angles.cos(), angles.sin()


def rope(x: Tensor, table: Rotary) -> Tensor:
    """Rotary embedding on the two halves of the last dim of x [B, H, T, D]."""
    cos, sin = table
    x1, x2 = _wide(x).chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def attention_bias(allowed: Tensor, groups: int, dtype: torch.dtype) -> Tensor:
    """allowed [B, T, S] bool -> additive bias [B, 1, groups*T, S] (0 or -inf), laid out
    for queries grouped per key/value head (multi-query attention)."""
    b, t, s = allowed.shape
    wide = torch.promote_types(dtype, torch.float32)
    bias = torch.zeros(b, t, s, dtype=wide, device=allowed.device).masked_fill_(~allowed, float("-inf"))
    return bias[:, None].expand(b, groups, t, s).reshape(b, 1, groups * t, s)


def attend_prefix(q: Tensor, k: Tensor, v: Tensor, key_valid: Tensor | None) -> Tensor:
    """Bidirectional attention of q [B, H, T, D] over k, v [B, KV, S, D] in one fused
    kernel (scaled_dot_product_attention; its softmax accumulates in float32 for bf16).

    ``key_valid`` [B, S] bool marks the keys every query may see; None: all of them
    (the fused kernel then skips the mask entirely). Queries are grouped per
    key/value head, as in :func:`attend`."""
    return _grouped_sdpa(q, k, v, None if key_valid is None else key_valid[:, None, None, :])


def attend_cached(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor) -> Tensor:
    """Attention of q [B, H, T, D] over a slot's keys/values k, v [B, KV, S, D], read in place,
    where ``allowed`` [B, T, S] bool says which keys each query sees; one fused kernel
    (scaled_dot_product_attention), queries grouped per key/value head as in :func:`attend`."""
    b, h, t, _ = q.shape
    groups, s = h // k.shape[1], k.shape[2]
    return _grouped_sdpa(q, k, v, allowed[:, None].expand(b, groups, t, s).reshape(b, 1, groups * t, s))


def _grouped_sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """scaled_dot_product_attention with q [B, H, T, D] grouped per key/value head as rows
    [B, KV, (H / KV) * T, D] (``mask`` in that row layout, or None)."""
    b, h, t, d = q.shape
    kv = k.shape[1]
    out = F.scaled_dot_product_attention(q.reshape(b, kv, (h // kv) * t, d), k, v, attn_mask=mask)
    return out.reshape(b, h, t, d)


def attend(q: Tensor, parts: list[tuple[Tensor, Tensor, Tensor]]) -> Tensor:
    """Multi-query attention of ``q`` over one or more key/value parts.

    q [B, H, T, D]; each part is (k [B, KV, S, D], v [B, KV, S, D], bias from
    :func:`attention_bias`). Parts are scored separately and share one
    softmax, so a cached prefix is read in place (no concatenation of
    keys/values). Every query row must be allowed at least one key.
    """
    b, h, t, d = q.shape
    kv = parts[0][0].shape[1]
    qg = q.reshape(b, kv, (h // kv) * t, d) * (d**-0.5)
    scores = [_wide(qg @ k.transpose(-1, -2)) + bias for k, _, bias in parts]
    probs = torch.softmax(torch.cat(scores, dim=-1) if len(scores) > 1 else scores[0], dim=-1).to(q.dtype)
    out, start = None, 0
    for k, v, _ in parts:
        piece = probs[..., start : start + k.shape[2]] @ v
        out = piece if out is None else out + piece
        start += k.shape[2]
    return out.reshape(b, h, t, d)

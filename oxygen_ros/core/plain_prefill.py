"""A plain PyTorch π0.5 prefill, to measure ours against.

The way openpi's PyTorch π0.5 (and LeRobot's ``pi05``) compute the prefix:
every camera slot goes through SigLIP (an absent camera is a black image
with its mask off), the prompt is padded to ``max_token_len``, and
transformers' ``GemmaModel`` runs over all of those positions with a 4-D
additive mask and a growing ``DynamicCache``. Ours skips absent cameras,
runs over the valid tokens only and writes into the KV pool.

The plain Gemma shares the VLA's weight tensors (built on the meta device
and given them with ``assign=True``), so it costs no memory and computes
the same function: :func:`plain_prefill` returns the same last-token
logits as :meth:`VLA.prefill`, up to the dtype's rounding.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .model.cache import KVCache
from .model.vla import VLA, PrefixBatch
from .timing import synchronize

ATTENTION = ("eager", "sdpa")


def plain_language_model(model: VLA, attention: str):
    """transformers' ``GemmaModel`` over the VLA's own VLM weights (shared, not copied)."""
    from transformers import GemmaConfig, GemmaModel
    from transformers.models.gemma.modeling_gemma import GemmaRotaryEmbedding

    if attention not in ATTENTION:
        raise ValueError(f"attention must be one of {ATTENTION}, got {attention!r}")
    c = model.config.vlm
    config = GemmaConfig(vocab_size=model.config.vocab_size, hidden_size=c.width, intermediate_size=c.mlp,
                         num_hidden_layers=c.depth, num_attention_heads=c.heads, num_key_value_heads=c.kv_heads,
                         head_dim=c.head_dim, hidden_activation="gelu_pytorch_tanh",
                         rms_norm_eps=model.config.rms_eps, rope_theta=model.config.rope_base)
    config._attn_implementation = attention
    with torch.device("meta"):
        gemma = GemmaModel(config)
    gemma.load_state_dict(model.language_model.state_dict(), assign=True)
    gemma.rotary_emb = GemmaRotaryEmbedding(config).to(model.device)  # its buffer is not in the state dict
    return gemma.eval()


@torch.inference_mode()
def plain_prefill(model: VLA, gemma, batch: PrefixBatch) -> Tensor:
    """The prefix of ``batch`` the plain way; returns logits [B, vocab] (float32) at each row's
    last valid token."""
    x, valid = model.embed_prefix(batch)  # every camera slot, the padded prompt
    positions = valid.long().cumsum(dim=1) - 1
    allowed = valid[:, None, None, :].expand(-1, 1, x.shape[1], -1)
    mask = torch.zeros(allowed.shape, dtype=x.dtype, device=x.device).masked_fill_(~allowed, torch.finfo(x.dtype).min)
    # x's text rows are already scaled by sqrt(width), as π0.5 wants (transformers 5 scales in the
    # embedding module, not in GemmaModel, so inputs_embeds go in as they are)
    out = gemma(inputs_embeds=x, attention_mask=mask, position_ids=positions, use_cache=True)
    last = valid.shape[1] - 1 - valid.flip(1).int().argmax(dim=1)
    h = out.last_hidden_state[torch.arange(x.shape[0], device=x.device), last]
    return model.language_model.logits(h).float()


@dataclass(frozen=True)
class PrefillTiming:
    name: str
    positions: int  # positions the VLM computed
    median_s: float
    times_s: list[float]

    @property
    def ms_per_position(self) -> float:
        return self.median_s / self.positions * 1e3


def compare_prefill(model: VLA, batch: PrefixBatch, attention: list[str], repeats: int,
                    progress: Callable[[str], None] = lambda _: None, *,
                    padded: bool = False) -> tuple[list[PrefillTiming], dict[str, float]]:
    """Ours against the plain prefill (one per attention implementation), interleaved
    ``repeats`` times after one warm-up each. ``padded`` adds ours without trimming
    (``ours_padded``: every camera slot and the padded prompt, as before absent cameras
    were skipped). Returns the timings and, per other variant, the largest logit
    difference to ours relative to ours' largest logit."""
    cache = model.new_cache(batch.size, batch.pixels.shape[1] * model.config.vision.tokens_per_image
                            + batch.tokens.shape[1])
    slots = [[i] for i in range(batch.size)]
    runs: dict[str, Callable[[], Tensor]] = {"ours": lambda: model.prefill(batch, cache, slots).logits}
    if padded:
        runs["ours_padded"] = lambda: _padded_prefill(model, batch, cache)
    for name in attention:
        gemma = plain_language_model(model, name)
        runs[f"plain_{name}"] = lambda g=gemma: plain_prefill(model, g, batch)
    logits = {}
    for name, run in runs.items():
        progress(f"warm-up: {name}")
        logits[name] = run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for rep in range(repeats):
        for name, run in runs.items():
            synchronize(model.device)
            start = time.perf_counter()
            run()
            synchronize(model.device)
            times[name].append(time.perf_counter() - start)
        progress(f"repeat {rep + 1}/{repeats}: " + ", ".join(f"{n} {t[-1]:.3f} s" for n, t in times.items()))
    ours_positions = int((batch.image_mask.sum(1) * model.config.vision.tokens_per_image
                          + batch.token_mask.sum(1)).max())
    every = batch.pixels.shape[1] * model.config.vision.tokens_per_image + batch.tokens.shape[1]
    timings = [PrefillTiming(name, ours_positions if name == "ours" else every, statistics.median(t), t)
               for name, t in times.items()]
    scale = float(logits["ours"].abs().max())
    agreement = {name: float((logits[name] - logits["ours"]).abs().max()) / scale
                 for name in logits if name != "ours"}
    return timings, agreement


@torch.inference_mode()
def _padded_prefill(model: VLA, batch: PrefixBatch, cache: KVCache) -> Tensor:
    x, lengths = model.prefix_states(batch)  # no trimming: every slot through both towers
    return model.write_prefix(cache, x, lengths, torch.arange(batch.size, device=x.device))

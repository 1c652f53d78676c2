"""The model's three cached operations at fixed shapes, one shape per bucket.

:class:`StaticPieces` runs the same computations as :class:`~.vla.VLA`'s
``prefill`` / ``denoise`` / ``decode_step``, on the pool's storage, but every
tensor shape depends only on the bucket, never on the data:

* a decode step reads the slots ``0 .. B-1`` (``B`` a batch bucket) over the
  whole slot length, masking each row's positions past its own token; rows
  that are not live write their key/value into the trash slot;
* a decode loop runs up to ``K`` such steps in one graph, as a loop whose
  length is an input (``steps``, at most ``K``: one graph serves every count),
  greedy: each row's next token is chosen in the graph (the most likely
  ``allowed`` one) and fed to the next step; a row stops writing after its
  end-of-sequence token or its ``remaining`` tokens (its later choices are not
  used), and the loop ends early when no row writes any more;
* a denoise runs all ``S`` flow-matching steps (one graph for the loop) for
  ``B`` rows (an observation-count bucket); each row reads its slot's prefix
  over the whole slot length, masked past its length; padding rows read the
  trash slot and are dropped. A denoise step runs one of them (the step an
  input), for a caller that loops over the steps itself (CUDA: ``compiled.py``);
* a prefill embeds ``B`` observations (padded with copies of the first one)
  with the prompt cut to a prompt-length bucket, and writes row ``j``'s prefix
  into slot ``dest[j]`` (padding rows: the trash slot).

Shapes being fixed, one compiled graph per bucket serves every frame
(``compiled.py``). The functions take and return tensors only.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch._higher_order_ops.while_loop import while_loop

from .cache import KVCache
from .vla import VLA, PrefixBatch


def greedy_allowed(logits: Tensor, allowed: Tensor) -> Tensor:
    """Each row's most likely token among the ``allowed`` [vocab] ids."""
    return logits.masked_fill(~allowed, float("-inf")).argmax(dim=-1)


class StaticPieces:
    """``model``'s operations on ``cache`` with ``steps`` denoise steps, at bucket shapes."""

    def __init__(self, model: VLA, cache: KVCache, steps: int):
        self.model, self.cache, self.steps = model, cache, steps

    def decode(self, tokens: Tensor, lengths: Tensor, live: Tensor) -> Tensor:
        """One token per slot ``0 .. B-1``: tokens, lengths [B] long, live [B] bool -> logits [B, vocab]."""
        positions = lengths[:, None]
        writes = live[:, None]
        return self.model.extend_rows(self.cache, 0, tokens[:, None], torch.ones_like(writes), positions, writes,
                                      self.cache.max_len)

    def decode_loop(self, tokens: Tensor, lengths: Tensor, live: Tensor, remaining: Tensor, allowed: Tensor,
                    eos: Tensor, columns: Tensor, steps: Tensor) -> Tensor:
        """Up to ``steps`` [1] (at most ``K = len(columns)``) greedy decode steps over slots
        ``0 .. B-1``: tokens, lengths, remaining [B] long (tokens each row may still produce),
        live [B] bool, allowed [vocab] bool (the ids a token may take), eos [1] long, columns
        ``arange(K)`` -> chosen tokens [B, K] (column ``t``: step ``t``'s). Row ``b``'s choice at
        step ``t`` counts only while it has not ended (its end-of-sequence token, or ``t``
        reaching ``remaining[b]``); an ended row writes nothing more into its slot. The loop is
        a ``while_loop``: its body is one graph whatever the count, and it writes the pool in place."""
        chosen = torch.zeros(tokens.shape[0], columns.shape[0], dtype=torch.long, device=tokens.device)
        writing = live & (remaining > 0)

        def more(t: Tensor, tokens: Tensor, writing: Tensor, chosen: Tensor) -> Tensor:
            return (t < steps[0]) & writing.any()

        def step(t: Tensor, tokens: Tensor, writing: Tensor, chosen: Tensor):
            logits = self.decode(tokens, lengths + t, writing)
            token = greedy_allowed(logits, allowed)
            chosen = torch.where(columns[None, :] == t, token[:, None], chosen)
            tokens = torch.where(writing, token, tokens)
            writing = writing & (token != eos) & (remaining > t + 1)
            return t + 1, tokens, writing, chosen

        start = torch.zeros((), dtype=torch.long, device=tokens.device)
        return while_loop(more, step, (start, tokens, writing, chosen))[3]

    def denoise(self, slots: Tensor, lengths: Tensor, noise: Tensor) -> Tensor:
        """All denoise steps for the prefixes in ``slots`` [B] (``lengths`` [B]); noise [B, H, A] -> actions."""
        return self.model.denoise_from(self._prefixes(slots), lengths, noise, self.steps)

    def denoise_step(self, slots: Tensor, lengths: Tensor, x_t: Tensor, step: Tensor, layers: Tensor,
                     final: Tensor) -> Tensor:
        """Denoise step ``step`` [1] long alone (``VLA.denoise_step``): x_t [B, H, A] -> the next x_t."""
        return self.model.denoise_step(self._prefixes(slots), lengths, x_t, step, layers, final, self.steps)

    def _prefixes(self, slots: Tensor) -> list[tuple[Tensor, Tensor]]:
        """The keys and values of ``slots`` [B], per expert layer, over the whole slot length."""
        return [(self.cache.k[i].index_select(0, slots), self.cache.v[i].index_select(0, slots))
                for i in range(self.model.config.expert.depth)]

    def prefill(self, pixels: Tensor, image_mask: Tensor, tokens: Tensor, token_mask: Tensor,
                dest: Tensor) -> tuple[Tensor, Tensor]:
        """Prefixes of B observations into slots ``dest`` [B] -> (lengths [B], logits [B, vocab])."""
        x, lengths = self.model.prefix_states(PrefixBatch(pixels, image_mask, tokens, token_mask))
        return lengths, self.model.write_prefix(self.cache, x, lengths, dest)

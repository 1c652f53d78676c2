"""The shape buckets of the compiled pieces, and a call's inputs fitted into them.

A compiled piece runs at fixed shapes (``static.py``): a decode at a batch bucket,
a denoise at an observation-count bucket, a prefill at (observations, cameras,
prompt length) buckets. A call is run at the smallest buckets that hold it, its
inputs padded up to them here; the padding rows write the trash slot and their
results are dropped (``compiled.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .vla import PrefixBatch


def batch_buckets(limit: int) -> tuple[int, ...]:
    """Powers of two below ``limit``, then ``limit`` itself: 1, 2, 4, ..., limit."""
    if limit < 1:
        raise ValueError(f"a bucket limit must be >= 1, got {limit}")
    out, b = [], 1
    while b < limit:
        out.append(b)
        b *= 2
    return (*out, limit)


def prompt_buckets(max_token_len: int, smallest: int = 32) -> tuple[int, ...]:
    """Prompt lengths a prefill is compiled for: ``smallest``, doubling, up to the model's maximum."""
    out, n = [], smallest
    while n < max_token_len:
        out.append(n)
        n *= 2
    return (*out, max_token_len)


def bucket_for(n: int, buckets: tuple[int, ...], what: str) -> int:
    """The smallest bucket that holds ``n``."""
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{what} of {n} exceeds the largest compiled bucket {buckets[-1]}")


def padded(values: Tensor | Sequence, size: int, dtype: torch.dtype) -> Tensor:
    """``values`` (a tensor or a list) followed by zeros up to ``size``, as one new host tensor."""
    values = values.reshape(-1).tolist() if isinstance(values, Tensor) else list(values)
    return torch.tensor(values + [0] * (size - len(values)), dtype=dtype)


def fit_prefill(batch: PrefixBatch, lo: int, hi: int, observations: tuple[int, ...], cameras: tuple[int, ...],
                prompts: tuple[int, ...]) -> PrefixBatch:
    """Rows ``lo .. hi-1`` of ``batch`` at the smallest buckets that hold them: padded with copies
    of row ``lo`` up to an ``observations`` bucket, each row's present cameras first and cut to a
    ``cameras`` bucket, the prompt cut to a ``prompts`` bucket. The compacted prefix of each row
    (its present cameras' tokens, then its prompt's) is unchanged."""
    rows = hi - lo
    b = bucket_for(rows, observations, "a prefill batch")
    counted = batch.prompt_lengths
    longest = max(counted[lo:hi]) if counted is not None else max(batch.token_mask[lo:hi].sum(dim=1).tolist())
    n = bucket_for(longest, prompts, "a prompt")
    present = batch.image_mask[lo:hi].tolist()  # the sizes are read on the host: no tensor operation each
    k = bucket_for(max(1, *map(sum, present)), cameras, "cameras present")
    if rows == b and all(p == sorted(p, reverse=True) for p in present):  # no padding row, cameras first
        return PrefixBatch(batch.pixels[lo:hi, :k], batch.image_mask[lo:hi, :k], batch.tokens[lo:hi, :n],
                           batch.token_mask[lo:hi, :n])
    pick = torch.cat([torch.arange(lo, hi), torch.full((b - rows,), lo)])
    mask = batch.image_mask[pick]
    cams = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)[:, :k]  # present first, in their order
    row = torch.arange(b)[:, None]
    return PrefixBatch(batch.pixels[pick][row, cams], mask[row, cams], batch.tokens[pick, :n], batch.token_mask[pick, :n])

"""The key/value storage layout the model reads and writes, and the per-step view.

The storage is allocated once by its owner (the KV pool) and handed to every
model call. Layout: ``k`` and ``v`` are ``[layers, slots + 1, kv_heads,
max_len, head_dim]``; slot ``i`` holds one sequence with its token at position
``p`` stored at index ``p`` (prefixes are stored compacted: valid tokens only,
in order). The extra last slot is a write-only trash slot for rows of a batch
that are not live, so a fixed-shape batch never corrupts a real slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor


@dataclass(frozen=True)
class KVCache:
    k: Tensor
    v: Tensor

    @classmethod
    def allocate(
        cls,
        *,
        layers: int,
        kv_heads: int,
        head_dim: int,
        slots: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> "KVCache":
        """Zero-filled storage (zeros, so masked-out positions are always finite)."""
        shape = (layers, slots + 1, kv_heads, max_len, head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))

    @property
    def slots(self) -> int:
        """Usable slots (the trash slot excluded)."""
        return self.k.shape[1] - 1

    @property
    def trash_slot(self) -> int:
        return self.k.shape[1] - 1

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    def write(self, layer: int, slots: Tensor, positions: Tensor, k: Tensor, v: Tensor) -> None:
        """Store token ``j``'s key/value (``k[j]``, ``v[j]``: [kv_heads, head_dim]) of ``layer`` at
        ``positions[j]`` of slot ``slots[j]``, in place. Indexed on the whole storage (the layer as
        an index tensor, not a view): compiled, that is one in-place scatter of those tokens, where a
        write through a view of the layer would make the compiler copy the storage on every call."""
        layers = torch.full_like(slots, layer)
        self.k[layers, slots, :, positions] = k
        self.v[layers, slots, :, positions] = v

    def bytes_per_token(self) -> int:
        """Bytes one token's keys and values take over all layers."""
        layers, _, kv_heads, _, head_dim = self.k.shape
        return 2 * layers * kv_heads * head_dim * self.k.element_size()


@dataclass(frozen=True)
class SlotView:
    """A batch of consecutive slots ``start .. start + n`` read as one view.

    ``row_lengths[i]`` is how many tokens slot ``start + i`` already holds;
    ``max_len`` is their maximum (so no device sync is needed to size the
    view). Rows whose ``row_live`` flag is False are padding: they are
    computed but their writes go to the trash slot. The view is kept on the
    host; :attr:`lengths` and :attr:`live` are those rows as tensors on
    ``device``, made the first time the eager model asks (a compiled piece
    builds its padded inputs from the host lists).
    """

    start: int
    row_lengths: tuple[int, ...]
    max_len: int
    row_live: tuple[bool, ...] | None = None
    device: torch.device | str = "cpu"

    @classmethod
    def of(cls, start: int, lengths: Sequence[int], live: Sequence[bool] | None = None, device="cpu") -> "SlotView":
        if not lengths:
            raise ValueError("a SlotView needs at least one row")
        if live is not None and len(live) != len(lengths):
            raise ValueError(f"a SlotView has one live flag per row: {len(live)} flags for {len(lengths)} rows")
        return cls(start, tuple(lengths), max(lengths), None if live is None else tuple(live), device)

    @cached_property
    def lengths(self) -> Tensor:
        """[rows] long on ``device``."""
        return torch.tensor(self.row_lengths, dtype=torch.long, device=self.device)

    @cached_property
    def live(self) -> Tensor | None:
        """[rows] bool on ``device``, or None: every row live."""
        return None if self.row_live is None else torch.tensor(self.row_live, dtype=torch.bool, device=self.device)

    @property
    def rows(self) -> int:
        return len(self.row_lengths)

    @property
    def stop(self) -> int:
        return self.start + self.rows

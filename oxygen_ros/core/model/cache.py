"""The key/value storage layout the model reads and writes, and the per-step view.

The storage is allocated once by its owner (the KV pool) and handed to every
model call. Layout: ``k`` and ``v`` are ``[layers, slots + 1, kv_heads,
max_len, head_dim]``; slot ``i`` holds one sequence with its token at position
``p`` stored at index ``p`` (prefixes are stored compacted: valid tokens only,
in order). The extra last slot is a write-only trash slot for rows of a batch
that are not live, so a fixed-shape batch never corrupts a real slot.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    ``lengths[i]`` is how many tokens slot ``start + i`` already holds;
    ``max_len`` is their maximum as a host int (so no device sync is needed to
    size the view). Rows whose ``live`` flag is False are padding: they are
    computed but their writes go to the trash slot.
    """

    start: int
    lengths: Tensor
    max_len: int
    live: Tensor | None = None

    @classmethod
    def of(cls, start: int, lengths: list[int], live: list[bool] | None = None, device="cpu") -> "SlotView":
        if not lengths:
            raise ValueError("a SlotView needs at least one row")
        live_t = None if live is None else torch.tensor(live, dtype=torch.bool, device=device)
        return cls(start, torch.tensor(lengths, dtype=torch.long, device=device), max(lengths), live_t)

    @property
    def rows(self) -> int:
        return self.lengths.shape[0]

    @property
    def stop(self) -> int:
        return self.start + self.rows

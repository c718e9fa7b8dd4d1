"""A preallocated key/value cache whose live sequences occupy a contiguous slot prefix.

One tensor ``[layers, 2, slots, kv_heads, max_len, head_dim]`` holds every layer's keys
(index 0) and values (index 1). Decoding writes each new key/value in place at the
sequence's position, so no step allocates or concatenates. Sequences live in slots
``0 .. num_active - 1``; when one finishes, the last live slot is moved into its place
(one copy of one sequence), so a decode step works on a plain slice of the cache rather
than a gather over scattered slots.
"""

from __future__ import annotations

import math
import mmap

import torch


class SlotKVCache:
    """Keys and values of up to ``slots`` sequences of at most ``max_len`` tokens."""

    def __init__(self, *, layers: int, slots: int, kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        self.data = zeros_on_first_touch((layers, 2, slots, kv_heads, max_len, head_dim), dtype=dtype, device=device)
        self.lengths = [0] * slots
        """Tokens stored per slot (host copy; the next write position)."""

    @property
    def slots(self) -> int:
        return self.data.shape[2]

    @property
    def max_len(self) -> int:
        return self.data.shape[4]

    def fits(self, *, slots: int, max_len: int, dtype: torch.dtype, device: torch.device) -> bool:
        return (self.slots >= slots and self.max_len >= max_len and self.data.dtype == dtype
                and self.data.device == torch.device(device))

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(keys, values)`` of one layer, each ``[slots, kv_heads, max_len, head_dim]``."""
        return self.data[index, 0], self.data[index, 1]

    def write_rows(self, positions: torch.Tensor, first_slot: int = 0) -> torch.Tensor:
        """Where slot ``first_slot + i``'s token at ``positions[i]`` goes, per KV head: ``[N * kv_heads]``.

        Indexes the ``[slots * kv_heads * max_len, head_dim]`` view of one layer's keys (or
        values); computed once per decode step and shared by every layer.
        """
        slots, kv_heads, max_len = positions.shape[0], self.data.shape[3], self.max_len
        slot_heads = torch.arange(first_slot * kv_heads, (first_slot + slots) * kv_heads,
                                  device=positions.device).view(slots, kv_heads)
        return (slot_heads * max_len + positions[:, None]).reshape(-1)

    def write(self, *, layer: int, rows: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store ``keys``/``values`` ``[N, kv_heads, head_dim]`` at ``rows`` (from :meth:`write_rows`).

        One ``index_copy_`` per tensor: on CPU, advanced-index assignment
        (``cache[slots, :, positions] = k``) measured 40x slower at 64 slots.
        """
        head_dim = self.data.shape[-1]
        self.data[layer, 0].view(-1, head_dim).index_copy_(0, rows, keys.reshape(-1, head_dim))
        self.data[layer, 1].view(-1, head_dim).index_copy_(0, rows, values.reshape(-1, head_dim))

    def fill(self, *, first_slot: int, count: int, prefix: torch.Tensor) -> None:
        """Copy one prompt's ``prefix`` ``[layers, 2, kv_heads, L, head_dim]`` into ``count`` slots."""
        length = prefix.shape[3]
        self.data[:, :, first_slot : first_slot + count, :, :length] = prefix[:, :, None]
        for slot in range(first_slot, first_slot + count):
            self.lengths[slot] = length

    def move(self, *, source: int, target: int) -> None:
        """Move the sequence in slot ``source`` to slot ``target`` (one in-place copy)."""
        length = self.lengths[source]
        self.data[:, :, target, :, :length] = self.data[:, :, source, :, :length]
        self.lengths[target] = length


def zeros_on_first_touch(shape: tuple[int, ...], *, dtype: torch.dtype, device) -> torch.Tensor:
    """A zero tensor; on CPU backed by an anonymous memory map, whose pages the OS zero-fills on first touch.

    The cache is sized for the longest possible sequence in every slot, but with EOS most
    sequences use a fraction of their row (mean ~57 of 296 positions in the rollout
    benchmark). ``torch.zeros`` writes every byte up front, and on a VM the page faults
    that causes dominate: 1.75 GB took 1.3-2.6 s. Mapped pages are zeroed by the kernel
    when first used, so a call pays only for the positions it reaches. Stale entries must
    still be finite (masked attention multiplies them by zero), which zero pages are.
    """
    numel = math.prod(shape)
    if torch.device(device).type != "cpu" or numel == 0:
        return torch.zeros(shape, dtype=dtype, device=device)
    buffer = mmap.mmap(-1, numel * dtype.itemsize)  # the tensor keeps the mapping alive
    return torch.frombuffer(buffer, dtype=dtype, count=numel).view(shape)

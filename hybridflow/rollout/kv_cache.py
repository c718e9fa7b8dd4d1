"""The paged key/value cache: one preallocated pool of fixed-size blocks, read and written through block tables.

One tensor ``[layers, 2, kv_heads, blocks, block_size, head_dim]`` holds every layer's keys (index 0) and
values (index 1); a multi-head latent attention cache (:mod:`hybridflow.rollout.mla`) has one part, not two: each
token's compressed latent and rotated key ``[1, kv_lora_rank + rope_dim]``, no values. A sequence's positions live
in the blocks its block table names (:mod:`hybridflow.rollout.block_manager` hands them out): position ``p`` of the
sequence whose table row is ``t`` is at block ``t[p // B]``, offset ``p % B``. Decoding writes each new key/value in
place, so no step allocates or concatenates, and sequences never move.

The layout puts the block index right after the KV head so that, per layer and head, a table's blocks
gathered in order are one contiguous ``[N, W * B, D]`` run: on CPU, :meth:`PagedKVCache.span` gathers the
live blocks for SDPA with one ``index_select`` and no second copy; the Triton kernels read the blocks in
place through the table (:mod:`hybridflow.rollout.triton_attention`).
"""

from __future__ import annotations

import math
import mmap

import torch

from hybridflow.rollout.host_copy import device_tensor


class PagedKVCache:
    """Keys and values in ``blocks`` blocks of ``block_size`` positions; ``max_len`` is the attention span of a
    decode step (a block table row has ``ceil(max_len / block_size)`` entries)."""

    def __init__(self, *, layers: int, blocks: int, block_size: int, kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, parts: int = 2):
        self.data = zeros_on_first_touch((layers, parts, kv_heads, blocks, block_size, head_dim), dtype=dtype,
                                         device=device)
        self.max_len = max_len
        self._layer_views: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    @property
    def blocks(self) -> int:
        return self.data.shape[3]

    @property
    def block_size(self) -> int:
        return self.data.shape[4]

    @property
    def table_width(self) -> int:
        """Entries of a block table row: blocks that cover ``max_len`` positions."""
        return -(-self.max_len // self.block_size)

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(keys, values)`` of one layer, each ``[kv_heads, blocks, block_size, head_dim]``: views made once (two
        indexings a layer each decode step were ~1 ms of Python a step; issue 56)."""
        if self._layer_views is None:
            self._layer_views = [(self.data[layer, 0], self.data[layer, 1]) for layer in range(self.data.shape[0])]
        return self._layer_views[index]

    def write_rows(self, positions: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
        """Where row ``n``'s token at ``positions[n]`` goes, per KV head: ``[N * kv_heads]`` in ``(n, head)`` order.

        Indexes the ``[kv_heads * blocks * block_size, head_dim]`` view of one layer's keys (or values):
        ``(head * blocks + block) * B + offset`` with ``block = block_tables[n, p // B]``. Computed once per decode
        step and shared by every layer.
        """
        size = self.block_size
        block = block_tables.gather(1, (positions // size)[:, None]).long()  # [N, 1]
        heads = torch.arange(self.data.shape[2], device=positions.device)[None]  # [1, KV]
        return ((heads * self.blocks + block) * size + (positions % size)[:, None]).reshape(-1)

    def write(self, *, layer: int, rows: torch.Tensor, keys: torch.Tensor, values: torch.Tensor | None) -> None:
        """Store ``keys``/``values`` ``[N, kv_heads, head_dim]`` at ``rows`` (from :meth:`write_rows`); ``values``
        None for a one-part (latent) cache.

        One ``index_copy_`` per tensor: on CPU, advanced-index assignment measured 40x slower at 64 rows.
        """
        head_dim = self.data.shape[-1]
        for part, tensor in enumerate((keys, values)[: self.data.shape[1]]):
            self.data[layer, part].view(-1, head_dim).index_copy_(0, rows, tensor.reshape(-1, head_dim))

    def span(self, layer: int, block_tables: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of the blocks ``block_tables`` ``[N, W]`` names, gathered: each ``[N, KV, W * B, D]``
        (a view of one copy; positions past a row's length hold stale or null-block entries: mask them)."""
        return self.gather(layer, 0, block_tables), self.gather(layer, 1, block_tables)

    def gather(self, layer: int, part: int, block_tables: torch.Tensor) -> torch.Tensor:
        """One part (0: keys or latents, 1: values) of the blocks ``block_tables`` ``[N, W]`` names:
        ``[N, KV, W * B, D]``."""
        rows, width = block_tables.shape
        kv_heads, head_dim = self.data.shape[2], self.data.shape[5]
        gathered = self.data[layer, part].index_select(1, block_tables.reshape(-1))
        return gathered.view(kv_heads, rows, width * self.block_size, head_dim).transpose(0, 1)

    def write_prompt(self, blocks: list[int], kv: torch.Tensor, *, start: int) -> None:
        """Store positions ``start ..`` of a prompt's ``kv`` ``[layers, 2, KV, L, D]`` into its ``blocks`` (the
        table's). Whole blocks are written, from the one ``start`` falls in: ``kv`` holds that block's earlier
        positions too (a prefill returns its computed prefix with the new positions), so a chunk that starts
        inside a block rewrites them with the values they already have. Full blocks go straight from ``kv`` (a
        view; a padded copy of a long prompt's KV would double its peak memory), the partial last one padded."""
        size, length = self.block_size, kv.shape[3]
        first, full = start // size, length // size
        if full > first:
            target = torch.tensor(blocks[first:full], device=self.data.device)
            self.data.index_copy_(3, target, kv[:, :, :, first * size : full * size].unflatten(3, (full - first, size)))
        if length % size:
            tail = kv.new_zeros(*kv.shape[:3], 1, size, kv.shape[4])
            tail[:, :, :, 0, : length % size] = kv[:, :, :, full * size :]
            self.data.index_copy_(3, torch.tensor([blocks[full]], device=self.data.device), tail)

    def prefix(self, blocks: list[int], length: int) -> CachedPrefix:
        """The first ``length`` positions held in ``blocks``, to be read into a prefill's buffer (no copy yet)."""
        return CachedPrefix(self, list(blocks[: -(-length // self.block_size)]), length)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy each ``(source, target)`` block's keys and values (copy-on-write of a shared block)."""
        if not pairs:
            return
        source, target = (device_tensor(side, device=self.data.device) for side in zip(*pairs))
        self.data.index_copy_(3, target, self.data.index_select(3, source))


class CachedPrefix:
    """A sequence's first ``length`` cached positions, which a prefill (a later chunk of the prompt, or a prompt
    after a prefix-cache hit) attends to and returns with its new ones. Read straight into the prefill's
    ``[layers, 2, KV, length + new, D]`` buffer one layer at a time, rather than gathered whole and then copied:
    a long prompt's keys and values are the largest thing its last chunks hold, and two copies of them would be
    the peak (measured in docs/benchmarks.md)."""

    def __init__(self, cache: PagedKVCache, blocks: list[int], length: int):
        self.cache, self.blocks, self.length = cache, blocks, length

    def copy_into(self, out: torch.Tensor) -> None:
        """``out[:, :, :, :length]`` (``out`` is ``[layers, 2, KV, >= length, D]``) takes the cached positions."""
        index = torch.tensor(self.blocks, device=self.cache.data.device)
        for layer in range(out.shape[0]):  # [2, KV, blocks, B, D] gathered one layer at a time
            gathered = self.cache.data[layer].index_select(2, index).flatten(2, 3)
            out[layer, :, :, : self.length] = gathered[:, :, : self.length]


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
    # Private: Python's default for an anonymous map is shared memory (shmem), which gets no transparent huge pages.
    flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", getattr(mmap, "MAP_ANON", 0))
    buffer = mmap.mmap(-1, numel * dtype.itemsize, flags=flags)  # the tensor keeps the mapping alive
    if hasattr(mmap, "MADV_HUGEPAGE"):
        # Transparent huge pages where the kernel allows them (THP "madvise" or "always"): a decode step reads each
        # row's blocks from anywhere in the pool, and with 4 KB pages nearly every block costs a TLB miss. 2 MB
        # pages made the CPU attention kernel 1.24-1.26x faster (SmolLM2's shape, 32 rows of 48-111 positions,
        # 1 thread, best of 15 interleaved runs each, docs/benchmarks.md); untouched memory still costs nothing,
        # in 2 MB steps.
        buffer.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(buffer, dtype=dtype, count=numel).view(shape)


class SlotMirror:
    """On CPU, a contiguous copy of the live sequences' keys and values, row ``i`` for the ``i``-th live sequence:
    ``[layers, 2, rows, kv_heads, T, head_dim]`` (the engine's slot layout before the paged pool).

    Why: SDPA over the pool needs each row's blocks gathered first, which on CPU reads and writes the live bytes
    once more every layer of every step (docs/benchmarks.md: 13-35 % of a 64-row step, and about 40 % slower
    64-row steps end to end). Over this mirror a step's keys are a view. The pool stays the truth (sharing,
    prefix caching and preemption read it); the mirror is filled from it when a sequence joins, written beside
    it each step, and its last row moved into a finished sequence's row so the live rows stay ``0 .. N - 1``.
    Untouched pages cost nothing (:func:`zeros_on_first_touch`).
    """

    def __init__(self, *, layers: int, rows: int, kv_heads: int, max_len: int, head_dim: int, dtype: torch.dtype):
        self.data = zeros_on_first_touch((layers, 2, rows, kv_heads, max_len, head_dim), dtype=dtype, device="cpu")

    def fits(self, *, rows: int, max_len: int, dtype: torch.dtype) -> bool:
        return self.data.shape[2] >= rows and self.data.shape[4] >= max_len and self.data.dtype == dtype

    def load(self, row: int, prefix: CachedPrefix) -> None:
        """Row ``row`` takes a sequence's cached positions, read from the pool layer by layer."""
        prefix.copy_into(self.data[:, :, row])

    def move(self, *, source: int, target: int, length: int) -> None:
        self.data[:, :, target, :, :length] = self.data[:, :, source, :, :length]

    def write_rows(self, positions: torch.Tensor, first_row: int) -> torch.Tensor:
        """Flat ``[rows * KV * T]`` indices of row ``first_row + n``'s token at ``positions[n]``, per KV head."""
        count, kv_heads, max_len = positions.shape[0], self.data.shape[3], self.data.shape[4]
        row_heads = torch.arange(first_row * kv_heads, (first_row + count) * kv_heads).view(count, kv_heads)
        return (row_heads * max_len + positions[:, None]).reshape(-1)

    def write(self, *, layer: int, rows: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        head_dim = self.data.shape[-1]
        self.data[layer, 0].view(-1, head_dim).index_copy_(0, rows, keys.reshape(-1, head_dim))
        self.data[layer, 1].view(-1, head_dim).index_copy_(0, rows, values.reshape(-1, head_dim))


class MirroredCache:
    """What a CPU decode step over live rows ``first_row ..`` sees: the pool's interface for
    :meth:`LlamaFamilyDecoder.decode`, writing both the pool and the :class:`SlotMirror`, attending over the mirror."""

    def __init__(self, pool: PagedKVCache, mirror: SlotMirror, first_row: int):
        self.pool, self.mirror, self.first_row = pool, mirror, first_row
        self.max_len, self.block_size = pool.max_len, pool.block_size

    def write_rows(self, positions: torch.Tensor, block_tables: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pool.write_rows(positions, block_tables), self.mirror.write_rows(positions, self.first_row)

    def write(self, *, layer: int, rows: tuple[torch.Tensor, torch.Tensor], keys: torch.Tensor,
              values: torch.Tensor) -> None:
        self.pool.write(layer=layer, rows=rows[0], keys=keys, values=values)
        self.mirror.write(layer=layer, rows=rows[1], keys=keys, values=values)

    def span(self, layer: int, block_tables: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``first_row .. + N`` of the mirror over the ``W * B`` positions ``block_tables`` ``[N, W]`` spans."""
        rows = slice(self.first_row, self.first_row + block_tables.shape[0])
        width = block_tables.shape[1] * self.block_size
        return self.mirror.data[layer, 0, rows, :, :width], self.mirror.data[layer, 1, rows, :, :width]

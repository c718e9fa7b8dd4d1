"""The native engine's KV memory: the paged block pool, its block manager and, on CPU, the slot mirror; sized for
each run within ``gpu_memory_utilization`` of the device's memory, grown (never shrunk) as runs need, and given back
whole between rollouts (:meth:`KVPool.release`)."""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from hybridflow.errors import RolloutError
from hybridflow.rollout.block_manager import BLOCK_SIZE, BlockAllocator
from hybridflow.rollout.decoder import LlamaFamilyDecoder
from hybridflow.rollout.kv_cache import PagedKVCache, SlotMirror


class KVPool:
    """The block pool (:attr:`cache`), its :attr:`allocator` and the CPU :attr:`mirror` of one engine.

    Args:
        decoder: the engine's decoder (layers, heads, dtype and device of the cache).
        max_model_len: the longest row a block table spans.
        prefix_cache_tokens: tokens of finished sequences' blocks kept named for reuse.
        num_kv_blocks: the number of blocks, overriding the budget.
        gpu_memory_utilization: the fraction of the device's memory this process may reach with the pool.
        on_new_pool: called before a new pool is allocated (the engine drops the CUDA graphs over the old one).
    """

    def __init__(self, decoder: LlamaFamilyDecoder, *, max_model_len: int, prefix_cache_tokens: int,
                 num_kv_blocks: int | None, gpu_memory_utilization: float | None, on_new_pool: Callable[[], None]):
        self.decoder = decoder
        self.max_model_len = max_model_len
        self.prefix_cache_tokens = prefix_cache_tokens
        self.num_kv_blocks = num_kv_blocks
        self.gpu_memory_utilization = gpu_memory_utilization
        self.on_new_pool = on_new_pool
        self.cache: PagedKVCache | None = None
        self.allocator: BlockAllocator | None = None
        self.mirror: SlotMirror | None = None

    @property
    def device(self) -> torch.device:
        return self.decoder.embed.device

    def release(self) -> None:
        """Drop the pool (its named blocks with it) and the mirror."""
        self.cache = self.allocator = self.mirror = None

    @property
    def bytes(self) -> int:
        """Bytes allocated for the KV cache now: the block pool and, on CPU, the slot mirror (on CPU only the pages
        written are resident: :func:`~hybridflow.rollout.kv_cache.zeros_on_first_touch`)."""
        held = [self.cache.data] if self.cache is not None else []
        if self.mirror is not None:
            held.append(self.mirror.data)
        return sum(tensor.numel() * tensor.element_size() for tensor in held)

    def mirror_for(self, cache: PagedKVCache, rows: int) -> SlotMirror | None:
        """On CPU without the paged kernel (:mod:`hybridflow.rollout.cpu_attention`), the :class:`SlotMirror` SDPA
        reads, with ``rows`` rows (reused while it is large enough; its untouched pages cost nothing); ``None``
        elsewhere."""
        if self.device.type != "cpu" or self.decoder.paged_cpu_attention:
            return None  # attention reads the pool itself
        span, dtype = cache.table_width * cache.block_size, self.decoder.embed.dtype
        if self.mirror is None or not self.mirror.fits(rows=rows, max_len=span, dtype=dtype):
            self.mirror = None  # free the old one first
            self.mirror = SlotMirror(layers=self.decoder.num_layers, rows=rows,
                                     kv_heads=self.decoder.kv_heads, max_len=span, head_dim=self.decoder.head_dim,
                                     dtype=dtype)
        return self.mirror

    def reserve(self, *, sequences: int, max_len: int) -> PagedKVCache:
        """The block pool, grown when it holds fewer blocks than ``sequences`` sequences of ``max_len`` take (at
        most what ``gpu_memory_utilization`` leaves room for: the rest wait, and preemption keeps the running ones
        within the pool). It never shrinks, and growing it keeps the named blocks (a conversation's next, longer
        turn still finds its earlier turns)."""
        dtype = self.decoder.embed.dtype
        max_len = self._row_length(max_len)
        per_sequence = -(-max_len // BLOCK_SIZE)
        blocks = self.num_kv_blocks or min(sequences * per_sequence + 1, self._blocks_within_budget(max_len))
        if blocks < per_sequence + 1:
            raise RolloutError(f"num_kv_blocks={blocks} cannot hold one sequence of {max_len} positions: it needs "
                               f"{per_sequence + 1} blocks of {BLOCK_SIZE} (the null block included); raise it or "
                               "lower max_model_len")
        if self.cache is None or self.cache.data.dtype != dtype:
            self._new_pool(blocks, max_len, keep_named=False)
        elif self.cache.blocks < blocks:
            self._new_pool(blocks, max(max_len, self.cache.max_len), keep_named=True)
        self.cache.max_len = max(self.cache.max_len, max_len)  # a wider table (new graphs on CUDA)
        return self.cache

    def _new_pool(self, blocks: int, max_len: int, *, keep_named: bool) -> None:
        """Allocate a pool of ``blocks`` blocks; with ``keep_named``, the named blocks keep their ids and contents
        (no sequence is live between calls, so no other block holds anything still read)."""
        named = sorted(self.allocator.key_of) if keep_named else []
        kept = self.cache.data[:, :, :, named].clone() if named else None
        allocator = self.allocator.grown(blocks) if keep_named else BlockAllocator(
            blocks, block_size=BLOCK_SIZE, cached_blocks=self.prefix_cache_tokens // BLOCK_SIZE)
        self.cache = self.allocator = None  # free the old ones (and the graphs over them) before allocating
        self.on_new_pool()
        self.cache = PagedKVCache(
            layers=self.decoder.num_layers, blocks=blocks, block_size=BLOCK_SIZE, kv_heads=self.decoder.kv_heads,
            max_len=max_len, head_dim=self.decoder.head_dim, dtype=self.decoder.embed.dtype, device=self.device,
            parts=self.decoder.kv_parts,
        )
        if kept is not None:
            self.cache.data[:, :, :, named] = kept
        self.allocator = allocator

    def _row_length(self, max_len: int) -> int:
        """Positions a block table spans: with the Triton kernels, a multiple of their span rounding (fewer caches,
        so fewer graph captures and kernel compiles)."""
        if not self.decoder.triton_kernels:
            return max_len
        from hybridflow.rollout.triton_attention import SPAN_ROUNDING

        return min(self.max_model_len, -(-max_len // SPAN_ROUNDING) * SPAN_ROUNDING)

    def _blocks_within_budget(self, max_len: int) -> int:
        """KV blocks that fit in ``gpu_memory_utilization`` of the device's memory (GPU memory on CUDA, RAM on
        CPU), counting what this process holds now besides this engine's cache; no limit when it is ``None``."""
        if self.gpu_memory_utilization is None:
            return 2**62
        own = 0 if self.cache is None else self.cache.data.numel() * self.cache.data.element_size()
        total, in_use = device_memory(self.device)
        per_block = (self.decoder.num_layers * self.decoder.kv_parts * self.decoder.kv_heads * self.decoder.head_dim * BLOCK_SIZE
                     * self.decoder.embed.element_size())
        return kv_blocks_within(budget=self.gpu_memory_utilization * total - max(in_use - own, 0), per_block=per_block,
                                utilization=self.gpu_memory_utilization, total=total, max_len=max_len)


def kv_blocks_within(*, budget: float, per_block: int, utilization: float, total: int, max_len: int) -> int:
    """How many KV blocks of ``per_block`` bytes fit in ``budget`` bytes; one line naming the fix when fewer than one
    sequence of ``max_len`` positions needs (plus the null block) do."""
    needed = -(-max_len // BLOCK_SIZE) + 1
    if budget < needed * per_block:
        gib = 2**30
        raise RolloutError(
            f"the KV cache of one sequence of {max_len} positions needs {needed * per_block / gib:.2f} GiB, but "
            f"rollout.gpu_memory_utilization={utilization} of {total / gib:.0f} GiB leaves {max(budget, 0) / gib:.2f} "
            "GiB after what is already allocated: raise rollout.gpu_memory_utilization, lower max_model_len "
            "(prompt_length + response_length), or offload the actor during rollout")
    return int(budget // per_block)


def device_memory(device: torch.device) -> tuple[int, int]:
    """``(total bytes, bytes this process holds)`` of ``device``'s memory: the GPU's, or on CPU the machine's RAM
    and this process's resident set."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory, torch.cuda.memory_allocated(device)
    page = os.sysconf("SC_PAGE_SIZE")
    with open("/proc/self/statm") as statm:
        resident = int(statm.read().split()[1]) * page
    return os.sysconf("SC_PHYS_PAGES") * page, resident

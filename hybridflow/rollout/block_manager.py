"""Block bookkeeping of the paged KV cache: an allocator with refcounts and prefix caching by block hash.

The cache is a pool of fixed-size blocks of :data:`BLOCK_SIZE` positions (Kwon et al. 2023, "Efficient
Memory Management for Large Language Model Serving with PagedAttention"). A sequence holds a *block
table*: the ids of the blocks its positions ``0, 1, ...`` live in, ``BLOCK_SIZE`` positions a block. This
module only counts and names blocks; the tensors live in :class:`~hybridflow.rollout.kv_cache.PagedKVCache`
and the engine copies a block's contents when this module says so. The same code runs on every device.

- **Sharing.** A block may be in several tables (the ``n`` samples of a GRPO prompt share its prompt
  blocks); its refcount is the number of tables that hold it, and it returns to the pool at zero.
- **Copy-on-write.** A shared block is never written: a sequence about to write into a block that others
  hold (the prompt's partial last block, at each sample's first decode step) gets a fresh block and the
  engine copies the old one into it (:meth:`SequenceBlocks.prepare_write` returns the copy).
- **Prefix caching by block hash.** A full block is named by the token ids it holds chained with the name
  of the block before it, ``key_j = (hash(key_{j-1}), tokens[j*B : (j+1)*B])``, so the name covers the
  whole prefix up to the block's end. A later prompt that starts with the same tokens (the next turn of a
  conversation, the same prompt again) takes those blocks instead of recomputing them. Unreferenced named
  blocks stay in the pool, least recently used first to go, until a block is needed; new weights drop
  every name (the keys and values were computed with the old ones).

Block 0 is the *null block*: never handed out. Padding rows of a captured decode step and the unused
tail of every block table point at it, so their writes land where no sequence reads.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from hybridflow.errors import RolloutError

BLOCK_SIZE = 16
"""Positions per block, on every device. 16 (vLLM's default) rather than nano-vllm's 256: a prompt's samples
share every full block, and copy-on-write copies at most 15 positions per sample (with 256, a 200-token prompt
would share nothing and copy all of it); a multi-turn hit loses at most 15 tokens; and the Triton kernel reads
64 keys an iteration, 4 blocks, so smaller blocks cost it nothing. The price is a wider table (2k positions:
128 entries) and one host-side allocation every 16 decode steps per sequence."""

NULL_BLOCK = 0
"""The block padding rows and unused table entries point at; never allocated."""

BlockKey = tuple[int, tuple[int, ...]]
"""``(hash of the previous block's key, this block's token ids)``: names a full block by its whole prefix."""


class OutOfBlocks(Exception):
    """No free block is left; the scheduler preempts a sequence and tries again."""


class BlockAllocator:
    """``num_blocks`` blocks (block 0 reserved), refcounts, and the names of full blocks kept for reuse.

    Args:
        num_blocks: blocks in the pool, the null block included.
        block_size: positions per block.
        cached_blocks: most unreferenced named blocks kept for prefix reuse; 0 turns prefix caching off
            (blocks are still shared between the samples of a prompt).
    """

    def __init__(self, num_blocks: int, *, block_size: int = BLOCK_SIZE, cached_blocks: int = 0):
        if num_blocks < 2:
            raise RolloutError(f"a paged KV cache needs at least 2 blocks (one is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.cached_blocks = cached_blocks
        self.free: list[int] = list(range(num_blocks - 1, 0, -1))
        """A stack: the block freed last is handed out first (its pages are warm)."""
        self.refs = [0] * num_blocks
        self.key_of: dict[int, BlockKey] = {}
        self.block_of: dict[BlockKey, int] = {}
        self.evictable: OrderedDict[int, None] = OrderedDict()
        """Named blocks nobody holds, least recently released first."""
        self.hits = 0
        """Prompts that found at least one cached block."""
        self.reused_tokens = 0

    def grown(self, num_blocks: int) -> BlockAllocator:
        """This allocator over a larger pool (the cache grew): blocks ``self.num_blocks ..`` join the free list,
        the rest keep their refcounts and names."""
        added = list(range(num_blocks - 1, self.num_blocks - 1, -1))
        self.free = added + self.free  # the warm blocks stay on top of the stack
        self.refs += [0] * len(added)
        self.num_blocks = num_blocks
        return self

    @property
    def available(self) -> int:
        """Blocks :meth:`allocate` can still hand out (free, or named and unreferenced)."""
        return len(self.free) + len(self.evictable)

    def allocate(self) -> int:
        """A block of refcount 1: a free one, else the least recently released named block (its name is dropped)."""
        if self.free:
            block = self.free.pop()
        elif self.evictable:
            block, _ = self.evictable.popitem(last=False)
            del self.block_of[self.key_of.pop(block)]
        else:
            raise OutOfBlocks
        self.refs[block] = 1
        return block

    def retain(self, block: int) -> None:
        """One more table holds ``block``."""
        if self.refs[block] == 0:
            self.evictable.pop(block)
        self.refs[block] += 1

    def release(self, block: int) -> None:
        """One table fewer holds ``block``; at zero it is kept for reuse when named, else freed."""
        self.refs[block] -= 1
        if self.refs[block] > 0:
            return
        if block in self.key_of and self.cached_blocks > 0:
            self.evictable[block] = None
            if len(self.evictable) > self.cached_blocks:
                oldest, _ = self.evictable.popitem(last=False)
                self._forget(oldest)
                self.free.append(oldest)
        else:
            self._forget(block)
            self.free.append(block)

    def _forget(self, block: int) -> None:
        key = self.key_of.pop(block, None)
        if key is not None:
            del self.block_of[key]

    def name(self, block: int, key: BlockKey) -> None:
        """Record that full ``block`` holds the prefix ``key``; a prefix already named keeps its first block."""
        if self.cached_blocks > 0 and key not in self.block_of and block not in self.key_of:
            self.block_of[key] = block
            self.key_of[block] = key

    def cached_prefix(self, token_ids: list[int]) -> tuple[list[int], list[BlockKey]]:
        """The named blocks holding the longest prefix of ``token_ids[:-1]`` in whole blocks, and their keys (not
        yet retained). The last token is left out: its logits start the completion, so it is always computed."""
        blocks, keys, parent = [], [], 0
        size = self.block_size
        for start in range(0, len(token_ids) - size, size):
            key = (parent, tuple(token_ids[start : start + size]))
            block = self.block_of.get(key)
            if block is None:
                break
            blocks.append(block)
            keys.append(key)
            parent = hash(key)
        return blocks, keys

    def drop_names(self) -> None:
        """Forget every name (new weights): unreferenced named blocks return to the free list."""
        self.free.extend(self.evictable)
        self.evictable.clear()
        self.key_of.clear()
        self.block_of.clear()


@dataclass
class SequenceBlocks:
    """One sequence's block table and the keys of its named full blocks.

    ``blocks[j]`` holds positions ``j * B .. (j + 1) * B - 1``; ``keys[j]`` is block ``j``'s name, known for
    the first ``len(keys)`` full blocks.
    """

    allocator: BlockAllocator
    blocks: list[int] = field(default_factory=list)
    keys: list[BlockKey] = field(default_factory=list)

    @classmethod
    def for_prompt(cls, allocator: BlockAllocator, token_ids: list[int], *, reserve: int = 0
                   ) -> tuple[SequenceBlocks, int] | None:
        """Blocks for a prompt about to be prefilled, reusing its longest cached prefix: ``(table, cached
        tokens)``, or ``None`` (nothing taken) when fewer than ``reserve`` blocks would be left afterwards."""
        cached, keys = allocator.cached_prefix(token_ids)
        needed = -(-len(token_ids) // allocator.block_size) - len(cached)
        revived = sum(1 for block in cached if allocator.refs[block] == 0)
        if allocator.available - revived < needed + reserve:
            return None
        for block in cached:
            allocator.retain(block)
        if cached:
            allocator.hits += 1
            allocator.reused_tokens += len(cached) * allocator.block_size
        table = cls(allocator, list(cached), list(keys))
        table.blocks += [allocator.allocate() for _ in range(needed)]
        return table, len(cached) * allocator.block_size

    def fork(self) -> SequenceBlocks:
        """Another table over the same blocks (a prompt's next sample); every block gains a reference."""
        for block in self.blocks:
            self.allocator.retain(block)
        return SequenceBlocks(self.allocator, list(self.blocks), list(self.keys))

    def prepare_write(self, position: int) -> tuple[int, int] | None:
        """Make ``position`` writable by this sequence alone: a new block at a block boundary, or a private
        copy of a shared block. Returns ``(source, target)`` blocks whose contents the caller must copy, or
        ``None``. Raises :class:`OutOfBlocks` (changing nothing) when no block is left."""
        index = position // self.allocator.block_size
        if index == len(self.blocks):
            self.blocks.append(self.allocator.allocate())
            return None
        shared = self.blocks[index]
        if self.allocator.refs[shared] == 1:
            return None
        private = self.allocator.allocate()
        self.allocator.release(shared)
        self.blocks[index] = private
        return shared, private

    def needs_block(self, position: int) -> bool:
        """Whether :meth:`prepare_write` at ``position`` takes a block from the pool."""
        index = position // self.allocator.block_size
        return index == len(self.blocks) or self.allocator.refs[self.blocks[index]] > 1

    def name_full_blocks(self, token_ids: list[int], length: int) -> None:
        """Name the blocks filled by the first ``length`` of ``token_ids`` (whose keys and values are now in
        the cache), so later prompts can reuse them."""
        size = self.allocator.block_size
        if self.allocator.cached_blocks == 0:
            return  # no prefix caching: names would never be looked up
        while len(self.keys) < length // size:
            start = len(self.keys) * size
            parent = hash(self.keys[-1]) if self.keys else 0
            key = (parent, tuple(token_ids[start : start + size]))
            self.allocator.name(self.blocks[len(self.keys)], key)
            self.keys.append(key)

    def free(self) -> None:
        """Release every block (the sequence ended or was preempted)."""
        for block in self.blocks:
            self.allocator.release(block)
        self.blocks.clear()
        self.keys.clear()

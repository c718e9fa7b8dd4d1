"""The block allocator and the scheduler's block decisions on hand-made schedules (blocks of 4 positions)."""

import math
from collections import deque

import pytest
import torch

from hybridflow.rollout import SamplingParams
from hybridflow.rollout.block_manager import BlockAllocator, OutOfBlocks, SequenceBlocks
from hybridflow.rollout.kv_cache import PagedKVCache
from hybridflow.rollout.native import GenerationRun, HostBlockTables, PendingPrompt, Sequence
from hybridflow.rollout.scheduler import head_waits, prefill_allowance, schedule_writes


def allocator(blocks: int, *, cached: int = 0) -> BlockAllocator:
    return BlockAllocator(blocks, block_size=4, cached_blocks=cached)


def test_blocks_are_handed_out_lowest_first_reused_last_freed_first_and_never_the_null_block():
    pool = allocator(4)
    assert [pool.allocate() for _ in range(3)] == [1, 2, 3] and pool.available == 0
    with pytest.raises(OutOfBlocks):
        pool.allocate()
    pool.release(2)
    pool.release(1)
    assert pool.available == 2 and pool.allocate() == 1  # the block freed last is warm: it goes first


def test_samples_share_the_prompt_blocks_and_the_last_holder_frees_them():
    pool = allocator(8)
    prompt, cached = SequenceBlocks.for_prompt(pool, list(range(10)))  # 10 tokens: blocks of 4, 4 and 2
    assert prompt.blocks == [1, 2, 3] and cached == 0 and pool.available == 4
    samples = [prompt.fork() for _ in range(3)]
    assert all(s.blocks == [1, 2, 3] for s in samples) and pool.refs[1:4] == [4, 4, 4]
    prompt.free()
    samples[0].free()
    samples[1].free()
    assert pool.refs[1:4] == [1, 1, 1] and pool.available == 4
    samples[2].free()
    assert pool.available == 7


def test_a_shared_partial_block_is_copied_on_write_and_the_last_holder_writes_in_place():
    pool = allocator(8)
    prompt, _ = SequenceBlocks.for_prompt(pool, list(range(10)))
    first, second = prompt.fork(), prompt.fork()
    assert first.prepare_write(10) == (3, 4)  # position 10 is in block 3, shared by three: a private copy
    assert first.blocks == [1, 2, 4] and pool.refs[3] == 2
    prompt.free()
    assert second.prepare_write(10) is None and second.blocks == [1, 2, 3]  # the only holder now
    assert first.prepare_write(11) is None  # its own block
    assert first.prepare_write(12) is None and first.blocks == [1, 2, 4, 5]  # a boundary: a new block
    assert pool.refs[1:6] == [2, 2, 1, 1, 1]


def test_out_of_blocks_changes_nothing():
    pool = allocator(4)
    prompt, _ = SequenceBlocks.for_prompt(pool, list(range(10)))
    sample = prompt.fork()
    with pytest.raises(OutOfBlocks):
        sample.prepare_write(10)
    assert sample.blocks == [1, 2, 3] and pool.refs[1:4] == [2, 2, 2]
    assert SequenceBlocks.for_prompt(pool, [1, 2, 3]) is None  # a prompt that does not fit takes nothing


def test_the_next_turn_finds_the_blocks_of_the_first_by_their_chained_names():
    pool = allocator(16, cached=8)
    turn, _ = SequenceBlocks.for_prompt(pool, [1, 2, 3, 4, 5, 6])
    turn.name_full_blocks([1, 2, 3, 4, 5, 6], 6)  # after prefill: block 1 is full, block 2 is not
    assert len(pool.block_of) == 1
    turn.prepare_write(6)
    turn.prepare_write(7)
    turn.name_full_blocks([1, 2, 3, 4, 5, 6, 7, 8], 8)  # decode filled block 2
    turn.free()
    assert pool.available == 15 and list(pool.evictable) == [1, 2]  # unreferenced, still named
    second, cached = SequenceBlocks.for_prompt(pool, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert cached == 8 and second.blocks[:2] == [1, 2] and pool.hits == 1 and pool.reused_tokens == 8
    assert SequenceBlocks.for_prompt(pool, [1, 2, 3, 4, 5, 6, 7, 8])[1] == 4  # its last token is always computed
    assert SequenceBlocks.for_prompt(pool, [1, 2, 3, 4, 0, 6, 7, 8, 9])[1] == 4  # the first block only
    assert SequenceBlocks.for_prompt(pool, [0, 2, 3, 4, 5, 6, 7, 8, 9])[1] == 0  # block 2 names its prefix too


def test_unreferenced_named_blocks_go_least_recently_released_first():
    pool = allocator(4, cached=1)
    for tokens in ([1, 2, 3, 4, 9], [5, 6, 7, 8, 9]):
        table, _ = SequenceBlocks.for_prompt(pool, tokens)
        table.name_full_blocks(tokens, 5)
        table.free()
    assert list(pool.evictable) == [2] and len(pool.block_of) == 1  # over the budget of 1: the older one went
    assert SequenceBlocks.for_prompt(pool, [1, 2, 3, 4, 9])[1] == 0
    pool = allocator(3, cached=4)
    table, _ = SequenceBlocks.for_prompt(pool, [1, 2, 3, 4, 9])
    table.name_full_blocks([1, 2, 3, 4, 9], 5)
    table.free()
    assert [pool.allocate(), pool.allocate()] == [2, 1] and not pool.block_of  # the named one last, unnamed


def test_new_weights_drop_every_name():
    pool = allocator(8, cached=8)
    table, _ = SequenceBlocks.for_prompt(pool, [1, 2, 3, 4, 5])
    table.name_full_blocks([1, 2, 3, 4, 5], 5)
    table.free()
    pool.drop_names()
    assert pool.available == 7 and not pool.block_of and not pool.evictable
    assert SequenceBlocks.for_prompt(pool, [1, 2, 3, 4, 5])[1] == 0


def schedule(pool: BlockAllocator, rows: list[tuple[list[int], list[int]]]) -> GenerationRun:
    """A run whose live sequences (oldest first) hold ``(prompt, tokens so far)``, blocks for what is cached."""
    cache = PagedKVCache(layers=1, blocks=pool.num_blocks, block_size=4, kv_heads=1, max_len=32, head_dim=2,
                         dtype=torch.float32, device="cpu")
    run = GenerationRun(cache=cache, allocator=pool, generator=torch.Generator(), tokenizer=None, waiting=deque(),
                        max_num_seqs=8, tables=HostBlockTables(rows=8, width=cache.table_width))
    params = SamplingParams(temperature=0, max_tokens=20)
    for index, (prompt, tokens) in enumerate(rows):
        sequence = Sequence(index, 0, len(prompt), params, prompt_ids=prompt, token_ids=list(tokens))
        sequence.blocks, _ = SequenceBlocks.for_prompt(pool, prompt + tokens[:-1])
        run.join(sequence)
    return run


def test_when_blocks_run_out_the_latest_admitted_is_preempted_and_queued_first_to_recompute():
    pool = allocator(4)  # 3 usable blocks
    run = schedule(pool, [([1, 2, 3, 4], [5]), ([6, 7, 8, 9, 10, 11, 12, 13], [14])])  # both write at a boundary
    oldest, newest = run.live
    assert schedule_writes(run) == []  # writes at a boundary: new blocks, nothing to copy
    assert run.live == [oldest] and oldest.blocks.blocks == [1, 3] and run.preemptions == 1
    assert run.tables.gather([oldest.row], 3).tolist() == [[1, 3, 0]]  # what the decode step reads
    queued = run.waiting[0]
    assert queued.resumed is newest and newest.blocks is None
    assert queued.token_ids == [6, 7, 8, 9, 10, 11, 12, 13, 14] and queued.remaining == 1  # prompt + tokens so far


def test_the_latest_admitted_preempts_itself_when_no_one_newer_holds_blocks():
    pool = allocator(5)  # 4 usable blocks, 3 held
    run = schedule(pool, [([1, 2, 3, 4], [5]), ([6, 7, 8], [9]), ([1, 1, 1, 1], [2])])
    first, second, third = run.live
    schedule_writes(run)  # first takes the last free block, second writes in its own, third finds none
    assert run.live == [first, second] and run.waiting[0].resumed is third and run.preemptions == 1
    assert first.blocks.blocks == [1, 4] and second.blocks.blocks == [2] and pool.available == 1
    assert run.tables.gather([first.row, second.row], 2).tolist() == [[1, 4], [2, 0]]


def waiting_prompt(pool: BlockAllocator, run: GenerationRun, prompt: list[int]) -> PendingPrompt:
    """A waiting prompt whose prefill holds blocks for its tokens (queued last)."""
    pending = PendingPrompt(len(run.live) + len(run.waiting), prompt, remaining=1, params=SamplingParams())
    pending.blocks, pending.prefilled = SequenceBlocks.for_prompt(pool, prompt)
    run.waiting.append(pending)
    return pending


def test_a_waiting_prefill_gives_its_blocks_back_before_the_newest_sequence_preempts_itself():
    pool = allocator(4)  # 3 usable blocks: one held by the live row, one by each waiting prefill
    run = schedule(pool, [([1, 2, 3, 4], [5])])
    (only,) = run.live
    first, last = waiting_prompt(pool, run, [6, 7, 8]), waiting_prompt(pool, run, [9, 10])
    schedule_writes(run)
    assert run.live == [only] and run.preemptions == 0 and only.blocks.blocks == [1, 3]  # the last prefill's block
    assert last.blocks is None and last.prefilled == 0 and first.blocks.blocks == [2]


def test_a_shared_block_is_copied_before_its_write():
    pool = allocator(4)
    run = schedule(pool, [([1, 2, 3], [4])])  # writes position 3, inside its first block
    (only,) = run.live
    sibling = only.blocks.fork()  # another sample holds the same block
    assert schedule_writes(run) == [(1, 2)] and only.blocks.blocks == [2] and sibling.blocks == [1]
    assert run.tables.gather([only.row], 1).tolist() == [[2]]


def test_the_step_budget_left_for_prefill_and_when_the_head_waits():
    pool = allocator(8)
    run = schedule(pool, [([1, 2, 3, 4], [5]), ([6, 7], [8])])  # two live rows: two decode tokens of the budget
    run.step_prefill = 5
    assert prefill_allowance(run, token_budget=16, chunked=True) == 16 - 2 - 5
    assert prefill_allowance(run, token_budget=16, chunked=False) == math.inf
    waiting_prompt(pool, run, [9, 10, 11])
    assert head_waits(run)  # rows are running: they free blocks
    idle = schedule(allocator(8), [])
    idle.waiting.append(PendingPrompt(0, [1, 2], remaining=1, params=SamplingParams()))
    assert not head_waits(idle)  # nothing running and no prefill begun: a held prefill must give way

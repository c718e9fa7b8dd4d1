"""The native engine's scheduler: it plans one engine step over a :class:`GenerationRun` and never calls the engine.

What it decides (nano-vllm's ``scheduler`` does the same for its engine): which waiting prompts are prefilled in
this step and how far (the chunk budget of ``enable_chunked_prefill``), how the chunks group into packed passes,
which samples join the batch (admission waves: a free row and a free block each), and what gives its blocks back
when they run out (:func:`schedule_writes`: the latest admitted sequence first, LIFO). It takes and frees blocks
through the run (reservations, :meth:`GenerationRun.prepare_write`, :meth:`GenerationRun.preempt`); the engine's
:class:`~hybridflow.rollout.model_runner.ModelRunner` computes what it planned and the run records the results.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hybridflow.errors import RolloutError
from hybridflow.rollout.block_manager import OutOfBlocks, SequenceBlocks
from hybridflow.rollout.generation_run import GenerationRun, PendingPrompt, Sequence

Chunk = tuple[PendingPrompt, int, int]
"""``(prompt, start, end)``: positions ``start .. end - 1`` of a prompt to prefill."""


@dataclass
class PrefillPlan:
    """The prefill of one step: the chunks to compute, and the prompts that may join (a copy of a prompt being
    prefilled shares its prefill once it is done: :func:`share_prefills`)."""

    admissible: list[tuple[PendingPrompt, int]] = field(default_factory=list)
    """``(prompt, samples that may join)`` in queue order, while rows are free."""
    first_of: dict[tuple[int, ...], PendingPrompt] = field(default_factory=dict)
    """The prompt being prefilled, by its tokens: a copy of it waits for its prefill."""
    chunks: list[Chunk] = field(default_factory=list)


def admission_wave(run: GenerationRun) -> list[tuple[PendingPrompt, int]]:
    """``(prompt, samples)`` taken from the front of the queue, in order, while rows are free and a block
    is left for each sample's first write; a prompt whose samples do not all fit leads the next wave with
    the rest. Stops at the first prompt whose prefill is not complete."""
    free, spare, wave = run.max_num_seqs - len(run.live), run.allocator.available, []
    spare = max(spare, 0 if run.live else 1)  # an empty batch always takes one: preemption makes room
    while run.waiting and free > 0 and spare > 0 and run.waiting[0].ready:
        pending = run.waiting[0]
        count = min(pending.remaining, free, spare)
        wave.append((pending, count))
        free, spare = free - count, spare - count
        if count < pending.remaining:
            break
        run.waiting.popleft()
    return wave


def plan_prefill(run: GenerationRun, allowance: float) -> PrefillPlan:
    """The waiting prompts that get a row now, in queue order, while blocks for them (and a spare one per sample)
    are left (reserved here), spending at most ``allowance`` tokens with the decode tokens of the samples that join.

    Whole prompts when ``allowance`` is infinite. With chunked prefill, one decode token is set aside first for
    each sample that may join in this step without a prefill of its own (a prompt already prefilled, the same
    prompt again), then each prompt gets what is left (:func:`chunk_end`): its last chunk only when its own
    samples' decode tokens fit too."""
    plan, free = PrefillPlan(), run.max_num_seqs - len(run.live)
    for pending in run.waiting:
        if free <= 0:
            break
        plan.admissible.append((pending, min(pending.remaining, free)))
        free -= pending.remaining
    spent = 0
    for pending, joining in plan.admissible:
        first = pending if pending.ready else plan.first_of.setdefault(tuple(pending.key_ids), pending)
        spent += joining if first is not pending or pending.ready else 0
    for pending, joining in plan.admissible:
        if spent >= allowance:
            break
        if pending.ready or plan.first_of[tuple(pending.key_ids)] is not pending:
            continue
        if pending.blocks is None and not reserve_prompt(run, pending):
            break
        end = chunk_end(pending, allowance - spent, joining)
        if end == pending.prefilled:
            break
        plan.chunks.append((pending, pending.prefilled, end))
        spent += end - pending.prefilled + (joining if end == len(pending.token_ids) else 0)
    return plan


def share_prefills(plan: PrefillPlan) -> None:
    """After the plan's chunks ran: a copy shares a prefill that was under way when it was planned. A prompt already
    prefilled is nobody's first (a copy of it prefills itself, from the prefix cache if named), so a fork dropped to
    free blocks for the head is never made again at the next step, which would loop."""
    for pending, _ in plan.admissible:
        first = plan.first_of.get(tuple(pending.key_ids), pending)
        if first is not pending and first.ready and pending.blocks is None:
            pending.blocks, pending.first_logits = first.blocks.fork(), first.first_logits
            pending.prefilled = first.prefilled


def reserve_prompt(run: GenerationRun, pending: PendingPrompt) -> bool:
    """Blocks for all of ``pending``'s tokens (its cached prefix reused, and counted as prefilled), and a spare
    one for its first sample's first write unless nothing runs (then the prompt alone must fit); whether they
    were left."""
    reserved = SequenceBlocks.for_prompt(run.allocator, pending.key_ids, reserve=1 if run.live else 0)
    if reserved is None:
        return False
    pending.blocks, pending.prefilled = reserved
    return True


def prefill_passes(chunks: list[Chunk], *, token_budget: int, varlen: bool) -> list[list[Chunk]]:
    """The chunks grouped into packed passes of at most ``token_budget`` tokens (a longer chunk alone). With
    ``varlen`` (the decoder's FlashAttention prefill), chunks that start at position 0 get passes of their own: a
    pass with any earlier prefix to attend to (a later chunk, a prefix-cache hit) runs SDPA per prompt."""
    groups = [[c for c in chunks if c[1] == 0], [c for c in chunks if c[1] > 0]] if varlen else [chunks]
    passes = []
    for group in groups:
        batch, tokens = [], 0
        for chunk in group:
            width = chunk[2] - chunk[1]
            if batch and tokens + width > token_budget:
                passes.append(batch)
                batch, tokens = [], 0
            batch.append(chunk)
            tokens += width
        if batch:
            passes.append(batch)
    return passes


def blocks_for_next_writes(run: GenerationRun) -> bool:
    """Whether a free block is left for every live row whose next write needs one (a new block, or its own copy
    of a shared one), so that no row is preempted while a step is in flight."""
    needed = sum(s.blocks.needs_block(s.position) for s in run.live if not run.ended_ahead(s))
    return needed <= run.allocator.available


def schedule_writes(run: GenerationRun) -> list[tuple[int, int]]:
    """Give every live sequence a block of its own at its next position, oldest admitted first, preempting when
    blocks run out (:func:`make_room`); the ``(source, target)`` block copies (copy-on-write) the step runs before
    it writes. A row that its tokens in flight end writes nothing (:meth:`GenerationRun.ended_ahead`)."""
    copies = []
    for sequence in sorted(run.live, key=lambda s: s.admitted):  # oldest first: preemption takes the newest
        if sequence.blocks is None or run.ended_ahead(sequence):
            continue  # preempted in this loop, or writes nowhere
        while sequence.blocks is not None:
            try:
                copy = run.prepare_write(sequence)
            except OutOfBlocks:
                make_room(run, sequence)
                continue
            if copy is not None:
                copies.append(copy)
            break
    return copies


def make_room(run: GenerationRun, writer: Sequence) -> None:
    """Free blocks for ``writer``'s write: preempt the latest admitted other live sequence (LIFO, as vLLM and
    nano-vllm do), else drop the prefill a waiting prompt holds (:func:`held_prefill`), else preempt ``writer``
    itself (it no longer writes this step)."""
    newest = max(run.live, key=lambda s: s.admitted)
    if newest is not writer:
        run.preempt(newest)
        return
    held = held_prefill(run)
    if held is not None:
        held.drop_prefill()
    else:
        run.preempt(writer)


def prefill_allowance(run: GenerationRun, *, token_budget: int, chunked: bool) -> float:
    """What the step has left for prefill: its token budget less one decode token a live row (those that joined in
    this step included) and the prefill it already spent; unbounded without chunked prefill."""
    return token_budget - len(run.live) - run.step_prefill if chunked else math.inf


def head_waits(run: GenerationRun) -> bool:
    """The head of the queue, with no wave to admit, waits: running sequences will free blocks, or its prefill goes
    on in a later chunk. Otherwise (nothing running, no prefill begun) a held prefill must give its blocks back."""
    return bool(run.live) or run.waiting[0].blocks is not None


def held_prefill(run: GenerationRun) -> PendingPrompt | None:
    """The waiting prompt whose prefill gives its blocks back first: the last one in the queue holding blocks."""
    return next((pending for pending in reversed(run.waiting) if pending.blocks is not None), None)


def chunk_end(pending: PendingPrompt, left: float, joining: int) -> int:
    """Where ``pending``'s next prefill chunk ends when the step has ``left`` tokens to spend: after its last token
    when the rest of it and one decode token for each of its ``joining`` samples fit (they join in this step), else
    as far as ``left`` reaches short of its last token (its samples join at a later step)."""
    total, rest = len(pending.token_ids), len(pending.token_ids) - pending.prefilled
    if rest + joining <= left:
        return total
    return pending.prefilled + int(min(rest - 1, left))


def check_token_budget(budget, *, max_num_seqs: int, chunked: bool) -> None:
    """Refuse, in one line naming the fix, a token budget the scheduler cannot work with."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise RolloutError(f"max_num_batched_tokens={budget!r} is not a positive number of tokens; set "
                           "rollout.max_num_batched_tokens to a positive integer (verl's default is 8192)")
    if chunked and budget <= max_num_seqs:
        raise RolloutError(f"max_num_batched_tokens={budget} must exceed max_num_seqs={max_num_seqs} with chunked "
                           "prefill (each live row decodes one token a step and prefill takes what is left): raise "
                           "rollout.max_num_batched_tokens, lower rollout.max_num_seqs, or set "
                           "rollout.enable_chunked_prefill=False")

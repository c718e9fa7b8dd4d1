"""The state of one generation over the native engine's paged KV cache: the sequences being decoded, the prompts
waiting for their prefill, the per-row tables a decode step reads, and the decode step in flight when the engine
overlaps its steps (:class:`InFlightStep`: launched, its tokens not read back yet).

:class:`GenerationRun` is what a :class:`~hybridflow.rollout.native.NativeEngine` admits into and steps (``_admit`` /
``_step``), and what a :class:`~hybridflow.rollout.request_queue.RequestQueue` or a
:class:`~hybridflow.rollout.streaming.StreamingSession` holds between steps. It lives apart from the engine so
that the queue and the sessions read the run's records without importing the engine that drives them (the engine
builds its ``generate`` on the queue).
"""

from __future__ import annotations

import functools
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from hybridflow.rollout.block_manager import NULL_BLOCK, BlockAllocator, SequenceBlocks
from hybridflow.rollout.host_copy import device_tensor, to_device
from hybridflow.rollout.kv_cache import PagedKVCache, SlotMirror
from hybridflow.rollout.sampler import RowSampling, draw_uniform, keyed_uniform, seen_mask
from hybridflow.rollout.stopping import StopChecker
from hybridflow.rollout.types import SamplingParams
from hybridflow.rollout.vision_prefill import PromptImages

@dataclass
class Sequence:
    """One completion being generated."""

    prompt_index: int
    output_index: int
    prompt_length: int
    params: SamplingParams
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    blocks: SequenceBlocks | None = None
    """Its block table while it is live."""
    images: PromptImages | None = None
    """A vision-language prompt's images (their embeddings for a recompute, its M-RoPE delta, its block names)."""
    admitted: int = 0
    """When it was (last) admitted: the latest admitted is preempted first."""
    row: int = -1
    """Its row of the run's :class:`HostBlockTables` while it is live."""
    ahead: int = 0
    """Its tokens sampled on the device whose values the host has not read back yet (steps in flight:
    :class:`InFlightStep`); always 0 when the engine does not overlap its steps."""

    @property
    def position(self) -> int:
        """Where its last token (sampled, not yet fed back) goes in the cache: the tokens cached so far, those still
        in flight counted."""
        return self.prompt_length + len(self.token_ids) + self.ahead - 1

    @property
    def sampled(self) -> int:
        """Tokens sampled so far, those in flight counted: the index of its next token."""
        return len(self.token_ids) + self.ahead

    def ends_by_length(self, max_len: int) -> bool:
        """Whether its tokens in flight reach ``max_tokens`` or ``max_len`` (known before their values are)."""
        return self.sampled >= self.params.max_tokens or self.prompt_length + self.sampled >= max_len

    @property
    def rope_delta(self) -> int:
        """Its tokens rotate at ``position + rope_delta`` (M-RoPE after a vision-language prompt; 0 for text)."""
        return 0 if self.images is None else self.images.delta

    def key_ids(self) -> list[int]:
        """Its tokens as its blocks are named (image tokens by their images: :meth:`PromptImages.key_ids`)."""
        prompt = self.prompt_ids if self.images is None else self.images.key_ids(self.prompt_ids)
        return prompt + self.token_ids


@dataclass
class PendingPrompt:
    """A prompt whose samples are not all admitted yet; its prefilled blocks are kept for them."""

    index: int
    token_ids: list[int]
    remaining: int
    params: SamplingParams
    blocks: SequenceBlocks | None = None
    """The prompt's blocks, reserved for all its tokens when its prefill starts; each admitted sample takes a
    fork of them."""
    prefilled: int = 0
    """Its first tokens whose keys and values are in ``blocks`` (a chunked prefill's progress; cached ones too)."""
    first_logits: torch.Tensor | None = None
    """``[V]`` logits after its last token: set when its prefill is complete."""
    resumed: Sequence | None = None
    """A paused or preempted sequence this prompt continues (``token_ids`` is then its prompt plus its
    tokens so far, ``remaining`` is 1): the next sampled token is appended to it."""
    images: PromptImages | None = None
    """A vision-language prompt's images, encoded (:func:`~hybridflow.rollout.vision_prefill.encode_prompt_images`)."""

    def start_sequence(self, output_index: int) -> Sequence:
        if self.resumed is not None:
            return self.resumed
        return Sequence(self.index, output_index, len(self.token_ids), self.params, prompt_ids=self.token_ids,
                        images=self.images)

    @functools.cached_property
    def key_ids(self) -> list[int]:
        """Its tokens as blocks are named and identical prompts found: image tokens by their images."""
        return self.token_ids if self.images is None else self.images.key_ids(self.token_ids)

    @property
    def ready(self) -> bool:
        """Its prefill is complete: its samples can join the batch."""
        return self.first_logits is not None

    def drop_prefill(self) -> None:
        """Forget the prefill, whole or partial (new weights, or its blocks are needed): it is computed again."""
        if self.blocks is not None:
            self.blocks.free()
        self.blocks = self.first_logits = None
        self.prefilled = 0


class InFlightStep:
    """A decode step launched on the device whose tokens the host has not read yet: its rows (the live sequences at
    launch, in row order), its sampled tokens ``[N]`` on the device (the next step's inputs, taken there), and one
    copy of the tokens and log-probs packed together into host memory, started without waiting for it (pinned
    memory and an event on CUDA; a plain tensor on CPU, where every op has finished when it returns)."""

    def __init__(self, rows: list[Sequence], tokens: torch.Tensor, logprobs: torch.Tensor, *, number: int):
        self.rows = rows
        self.tokens = tokens
        self.number = number
        """The run's count of launched decode steps when this one was launched (1 for the first)."""
        packed = torch.cat([tokens.to(torch.float64), logprobs.to(torch.float64)])  # token ids < 2**53: exact
        self.event = None
        if packed.device.type == "cuda":
            self.host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
            self.host.copy_(packed, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = packed

    def read(self) -> tuple[list[int], list[float]]:
        """``(tokens, logprobs)`` of its rows, waiting only for its own copy (not for steps launched after it)."""
        if self.event is not None:
            self.event.synchronize()
        values = self.host.tolist()
        count = len(self.rows)
        return [int(token) for token in values[:count]], values[count:]


class StepClock:
    """Host timestamps of decode steps, kept when a benchmark gives the engine one (``NativeEngine.step_clock``): the
    host gap of each step, from a step's readback returning to the next launch (all of that step's kernels queued),
    through which the device idles unless a step is in flight; and how long each readback waited for the device."""

    def __init__(self):
        self.gaps: list[float] = []
        self.waits: list[float] = []
        self.overlapped = 0
        """Readbacks that came after the next step's launch."""
        self._read_at: float | None = None

    def launched(self) -> None:
        if self._read_at is not None:
            self.gaps.append(time.perf_counter() - self._read_at)
            self._read_at = None

    def read(self, *, waited: float, overlapped: bool) -> None:
        self.waits.append(waited)
        self.overlapped += overlapped
        self._read_at = time.perf_counter()


@dataclass(eq=False)  # compared and hashed by identity: the engine keeps its open runs in a weak set
class GenerationRun:
    """The state of one generation: waiting prompts, live sequences, finished ones, and the blocks they hold."""

    cache: PagedKVCache
    allocator: BlockAllocator
    generator: torch.Generator
    tokenizer: object
    waiting: deque
    max_num_seqs: int
    tables: HostBlockTables
    mirror: SlotMirror | None = None
    """On CPU: row ``i`` holds ``live[i]``'s keys and values for attention."""
    live: list[Sequence] = field(default_factory=list)
    """The batch's rows; a finished sequence's place is taken by the last one (so the mirror moves one row)."""
    done: list[Sequence] = field(default_factory=list)
    preemptions: int = 0
    stop_checkers: dict[int, StopChecker] = field(default_factory=dict)
    """One per distinct ``SamplingParams`` (by identity)."""
    admissions: int = 0
    step_prefill: int = 0
    """Prompt tokens the current step's admission prefilled."""
    step_decode: int = 0
    """Rows the current step decoded (0 until it decodes)."""
    peak_step_tokens: int = 0
    """The most tokens (prefill + decode) one step of this run computed: at most the engine's budget with
    chunked prefill."""
    _rows: RowSampling | None = None
    _rows_of: list[SamplingParams] = field(default_factory=list)
    vocab_size: int = 0
    seen: SeenTokens | None = None
    """The tokens each row slot's sequence has seen, kept where a live sequence has a repetition penalty."""
    in_flight: InFlightStep | None = None
    """The decode step launched and not read back yet (the engine's ``overlap_steps``: it runs on the device while
    the host reads the step before it)."""
    launched_steps: int = 0
    """Decode steps launched over this run."""
    overlapped_readbacks: int = 0
    """Steps read back after the next step was launched (the host's bookkeeping overlapped the device's work)."""
    clock: StepClock | None = None
    """Host timestamps of the steps (a benchmark's); ``None``: none taken."""
    keyed_draws: bool = False
    """Sample with :func:`~hybridflow.rollout.sampler.keyed_uniform` draws keyed by (request seed, sample, token
    index) instead of the run's generator in row order: a request's tokens then do not depend on which requests
    shared its steps (a request queue whose requests arrive at times the engine does not choose)."""

    def stop_checker(self, params: SamplingParams) -> StopChecker:
        checker = self.stop_checkers.get(id(params))
        if checker is None:
            checker = self.stop_checkers[id(params)] = StopChecker(params=params, tokenizer=self.tokenizer)
        return checker

    def forget(self, params: SamplingParams) -> None:
        """Drop ``params``' stop checker (its request ended; a later ``SamplingParams`` may reuse its id)."""
        self.stop_checkers.pop(id(params), None)

    def step_uniform(self, *, device) -> torch.Tensor:
        """``[N, 1]`` draws for the live rows' next tokens."""
        if not self.keyed_draws:
            return draw_uniform(rows=len(self.live), generator=self.generator, device=device)
        return self._keyed([(s.params.seed, s.output_index, s.sampled) for s in self.live], device)

    def wave_uniform(self, wave: list[tuple[PendingPrompt, int]], *, device) -> torch.Tensor:
        """``[N, 1]`` draws for the first tokens of an admission wave's samples, in wave order."""
        if not self.keyed_draws:
            return draw_uniform(rows=sum(count for _, count in wave), generator=self.generator, device=device)
        keys = []
        for pending, count in wave:
            if pending.resumed is not None:  # a preempted sample: its own output index, its next token's index
                keys.append((pending.params.seed, pending.resumed.output_index, len(pending.resumed.token_ids)))
                continue
            first = pending.params.n - pending.remaining
            keys += [(pending.params.seed, first + offset, 0) for offset in range(count)]
        return self._keyed(keys, device)

    @staticmethod
    def _keyed(keys: list[tuple[int, int, int]], device) -> torch.Tensor:
        return to_device(keyed_uniform(torch.tensor(keys, dtype=torch.long)), device)

    def row_sampling(self, *, vocab_size: int, device) -> RowSampling:
        """The live rows' sampling parameters on the device; rebuilt only when the rows' params change."""
        params = [s.params for s in self.live]
        if self._rows is None or len(params) != len(self._rows_of) or any(
                a is not b for a, b in zip(params, self._rows_of)):
            self._rows = RowSampling.of(params, vocab_size=vocab_size, device=device)
            self._rows_of = params  # held, so no other SamplingParams can take these ids meanwhile
        return self._rows

    def join(self, sequence: Sequence) -> None:
        """Admit ``sequence`` (holding its blocks) into the batch."""
        self.admissions += 1
        sequence.admitted = self.admissions
        sequence.row = self.tables.take(sequence.blocks.blocks)
        if sequence.params.repetition_penalty != 1.0:
            if self.seen is None:
                self.seen = SeenTokens(rows=self.max_num_seqs, vocab_size=self.vocab_size, device=self.cache.data.device)
            self.seen.reset(sequence.row, sequence.prompt_ids + sequence.token_ids)
        if self.mirror is not None:  # its cached positions: the prompt and every token but the one to sample
            cached = sequence.prompt_length + len(sequence.token_ids)
            self.mirror.load(len(self.live), self.cache.prefix(sequence.blocks.blocks, cached))
        self.live.append(sequence)

    def append(self, sequence: Sequence, token: int, logprob: float) -> None:
        """Record a sampled token and decide whether the sequence has finished."""
        sequence.token_ids.append(token)
        sequence.logprobs.append(logprob)
        params = sequence.params
        if self.stop_checker(params).is_stop(sequence.token_ids):
            sequence.finish_reason = "stop"
        elif (len(sequence.token_ids) >= params.max_tokens
              or sequence.prompt_length + len(sequence.token_ids) >= self.cache.max_len):
            sequence.finish_reason = "length"

    def mark_seen(self, sequences: list[Sequence], tokens: list[int] | torch.Tensor) -> None:
        """Each sequence has seen its new token (kept only for those with a repetition penalty); ``tokens`` on the
        host, or ``[len(sequences)]`` on the device (a step's, before the host reads them)."""
        if self.seen is None:
            return
        marked = [(index, s.row) for index, s in enumerate(sequences) if s.params.repetition_penalty != 1.0]
        if not marked:
            return
        indices, slots = zip(*marked)
        if isinstance(tokens, torch.Tensor):
            chosen = tokens[device_tensor(indices, device=tokens.device)]
        else:
            chosen = device_tensor([tokens[index] for index in indices], device=self.seen.mask.device)
        self.seen.add(slots, chosen)

    def launched(self, tokens: torch.Tensor, logprobs: torch.Tensor) -> InFlightStep:
        """Record the step just launched over the live rows (its tokens, ``[N]`` on the device, now seen by them)
        and start reading it back."""
        self.mark_seen(self.live, tokens)
        self.launched_steps += 1
        step = InFlightStep(list(self.live), tokens, logprobs, number=self.launched_steps)
        for sequence in self.live:
            sequence.ahead += 1
        if self.clock is not None:
            self.clock.launched()
        return step

    def land(self, step: InFlightStep) -> None:
        """Read ``step``'s tokens back and do its bookkeeping: name the blocks its writes filled, append each row's
        token (a row that ended at an earlier step drops it: it was decoded once past its end), retire the
        finished rows. With a later step launched, the host does this while the device runs it."""
        overlapped = self.launched_steps > step.number
        self.overlapped_readbacks += overlapped
        started = time.perf_counter()
        tokens, logprobs = step.read()
        if self.clock is not None:
            self.clock.read(waited=time.perf_counter() - started, overlapped=overlapped)
        for sequence, token, logprob in zip(step.rows, tokens, logprobs):
            sequence.ahead -= 1
            if sequence.finish_reason is None:
                self.cached(sequence)
                self.append(sequence, token, logprob)
        self.retire()

    def land_in_flight(self) -> None:
        """Land the step in flight, if any: the host's records are then exact (admission and preemption need them)."""
        step, self.in_flight = self.in_flight, None
        if step is not None:
            self.land(step)

    def cached(self, sequence: Sequence) -> None:
        """The step being landed wrote ``sequence``'s last token read back, so every token read back is in the cache:
        name the block they filled, if they did."""
        end = sequence.prompt_length + len(sequence.token_ids)
        if end % self.allocator.block_size == 0 and self.allocator.cached_blocks > 0:
            sequence.blocks.name_full_blocks(sequence.key_ids(), end)

    def retire(self) -> None:
        """Remove finished sequences and free their blocks (named ones stay cached for reuse)."""
        for index in reversed(range(len(self.live))):  # the last row is always live or the finished one itself
            sequence = self.live[index]
            if sequence.finish_reason is not None:
                sequence.blocks.free()
                self.tables.give_back(sequence.row)
                self.done.append(sequence)
                self._remove(index)

    def _remove(self, index: int) -> None:
        """Take row ``index`` out of the batch: the last row moves into it (one mirror row copied)."""
        last = len(self.live) - 1
        if index != last:
            moved = self.live[index] = self.live[last]
            if self.mirror is not None:
                self.mirror.move(source=last, target=index, length=moved.position)
        self.live.pop()

    def prepare_write(self, sequence: Sequence) -> tuple[int, int] | None:
        """Give ``sequence`` a block of its own at its position (:meth:`SequenceBlocks.prepare_write`: a new block
        at a boundary, a copy of a shared one) and enter it in its row's table; the ``(source, target)`` block copy
        to run, if any. Raises :class:`OutOfBlocks` when none is free (the scheduler chooses what to preempt)."""
        copy = sequence.blocks.prepare_write(sequence.position)
        index = sequence.position // self.allocator.block_size
        if copy is not None or sequence.position % self.allocator.block_size == 0:  # a new block at index
            self.tables.set(sequence.row, index, sequence.blocks.blocks[index])
        return copy

    def preempt(self, sequence: Sequence) -> None:
        """Free ``sequence``'s blocks and queue it first: it is prefilled again from its prompt and tokens so far
        and continues from its next token (recompute)."""
        sequence.blocks.free()
        sequence.blocks = None
        self.tables.give_back(sequence.row)
        self._remove(self.live.index(sequence))
        self.preemptions += 1
        self.waiting.appendleft(PendingPrompt(sequence.prompt_index, sequence.prompt_ids + sequence.token_ids,
                                              remaining=1, params=sequence.params, resumed=sequence,
                                              images=sequence.images))

    def step_inputs(self, positions: list[int], *, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(tokens [N], positions [N], block tables [N, W])`` of the live rows; tables as wide as the widest
        row's (null blocks past a row's end; only null blocks for a row :meth:`ended_ahead`)."""
        width = max(len(s.blocks.blocks) for s in self.live)
        tables = self.tables.gather([s.row for s in self.live], width)
        ended = [index for index, s in enumerate(self.live) if self.ended_ahead(s)]
        if ended:
            tables[ended] = NULL_BLOCK
        return (self.input_tokens(device=device), device_tensor(positions, dtype=torch.long, device=device),
                to_device(tables, device))

    def input_tokens(self, *, device) -> torch.Tensor:
        """``[N]`` the live rows' last tokens: read on the host, or, with a step in flight (every live row is one of
        its rows then: nothing joins while one is), taken on the device from its sampled tokens."""
        step = self.in_flight
        if step is None:
            return device_tensor([s.token_ids[-1] for s in self.live], dtype=torch.long, device=device)
        if len(step.rows) == len(self.live):  # no row left since: the same rows in the same order
            return step.tokens
        index = {id(s): i for i, s in enumerate(step.rows)}
        return step.tokens[device_tensor([index[id(s)] for s in self.live], device=step.tokens.device)]

    def ended_ahead(self, sequence: Sequence) -> bool:
        """Whether ``sequence``'s tokens in flight end it by length (max_tokens, the cache's length: known before
        their values are). A step launched before they land still decodes its row, as padding does: at position 0
        of the null block, its token dropped (the row stays in place for the rows after it)."""
        return sequence.ahead > 0 and sequence.ends_by_length(self.cache.max_len)

    def step_positions(self) -> list[int]:
        """``[N]`` where each live row's step writes: its position, or 0 for a row :meth:`ended_ahead`."""
        return [0 if self.ended_ahead(s) else s.position for s in self.live]

    def rope_positions(self, positions: list[int], *, device) -> torch.Tensor | None:
        """``[N]`` where the live rows' tokens rotate, when any row's differs from its position (after a
        vision-language prompt); None otherwise. A row at position 0 (:meth:`ended_ahead`) rotates at 0."""
        deltas = [s.rope_delta for s in self.live]
        if not any(deltas):
            return None
        return device_tensor([p + d if p else 0 for p, d in zip(positions, deltas)], dtype=torch.long, device=device)

    def release(self) -> list[Sequence]:
        """Take every live sequence out (their blocks freed) and drop the waiting prompts' prefills. A step still in
        flight is dropped with them (land it first to keep its tokens: :meth:`land_in_flight`)."""
        live, self.live, self.in_flight = self.live, [], None
        for sequence in live:
            sequence.ahead = 0
            sequence.blocks.free()
            sequence.blocks = None
            self.tables.give_back(sequence.row)
        for pending in self.waiting:
            pending.drop_prefill()
        return live


def join_wave(run: GenerationRun, wave: list[tuple[PendingPrompt, int]], tokens: list[int],
              logprobs: list[float]) -> None:
    """Add every sample of an admission wave to ``run``'s batch with its first token (``tokens`` in wave order);
    a prompt whose samples have all joined gives its prefill's blocks to them."""
    joined, drawn = [], zip(tokens, logprobs)
    for pending, count in wave:
        output_start = pending.params.n - pending.remaining
        for offset, (token, logprob) in zip(range(count), drawn):
            sequence = pending.start_sequence(output_start + offset)
            sequence.blocks = pending.blocks.fork()
            run.join(sequence)
            run.append(sequence, token, logprob)
            joined.append(sequence)
        pending.remaining -= count
        if pending.remaining == 0:
            pending.drop_prefill()  # its samples hold the blocks now
    run.mark_seen(joined, tokens)
    run.retire()


class SeenTokens:
    """Per row slot, the tokens its sequence has seen (prompt and response), as a ``[rows, V]`` bool mask on the
    device, for the repetition penalty: set when a sequence joins, one entry a row each step, gathered by the
    rows that sample; so a step's cost does not grow with the sequences' lengths."""

    def __init__(self, *, rows: int, vocab_size: int, device):
        self.mask = torch.zeros(rows, vocab_size, dtype=torch.bool, device=device)

    def reset(self, slot: int, token_ids: list[int]) -> None:
        self.mask[slot] = seen_mask([token_ids], vocab_size=self.mask.shape[1], device=self.mask.device)[0]

    def add(self, slots: tuple[int, ...], token_ids: torch.Tensor) -> None:
        """Slot ``slots[i]`` has seen ``token_ids[i]`` (``[len(slots)]`` on the device: a step's tokens need no read
        back)."""
        self.mask[device_tensor(slots, device=self.mask.device), token_ids] = True

    def rows(self, slots: list[int]) -> torch.Tensor:
        """``[len(slots), V]``: the masks of these slots, in this order."""
        return self.mask[device_tensor(slots, device=self.mask.device)]


class HostBlockTables:
    """The live sequences' block tables as rows of one host tensor ``[rows, W]`` int32, changed entry by entry as
    blocks are added or copied, so a decode step takes its ``[N, W]`` tables with one ``index_select`` rather than
    building them from Python lists (256 rows x 128 entries each step would cost about a GPU step's tenth)."""

    def __init__(self, *, rows: int, width: int):
        self.data = torch.full((rows, width), NULL_BLOCK, dtype=torch.int32)
        self.free = list(range(rows - 1, -1, -1))

    def take(self, blocks: list[int]) -> int:
        """A row for a sequence joining the batch with ``blocks``; null blocks after them."""
        row = self.free.pop()
        self.data[row].fill_(NULL_BLOCK)
        self.data[row, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        return row

    def set(self, row: int, index: int, block: int) -> None:
        self.data[row, index] = block

    def give_back(self, row: int) -> None:
        self.free.append(row)

    def gather(self, rows: list[int], width: int) -> torch.Tensor:
        """``[len(rows), width]``: the first ``width`` entries of each row."""
        return self.data.index_select(0, torch.tensor(rows))[:, :width]

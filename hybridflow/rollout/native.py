"""The native generation engine: a slot KV cache with continuous batching.

Where HF ``generate`` loses time in RL rollouts, and what this engine does instead:

- it prefills each prompt ``n`` times (``num_return_sequences`` repeats the prompt);
  here a prompt is prefilled once and its keys/values are copied to its ``n`` slots;
- a finished sequence keeps being computed, as padding, until the longest one ends;
  here it is retired at once and a waiting sequence takes its slot (continuous
  batching), so every step computes only live sequences;
- its dynamic cache grows by concatenation; here the cache is preallocated and written
  in place.

Sampling runs on the device with a ``torch.Generator`` seeded from
``SamplingParams.seed``, so a fixed seed and the same inputs give the same outputs.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from hybridflow.cpu import return_freed_memory
from hybridflow.errors import RolloutError
from hybridflow.rollout.architectures import unsupported_reason
from hybridflow.rollout.cuda_graphs import DecodeGraphs
from hybridflow.rollout.decoder import LlamaFamilyDecoder
from hybridflow.rollout.kv_cache import SlotKVCache
from hybridflow.rollout.lanes import DecodeLanes
from hybridflow.rollout.prefix_cache import PrefixCache
from hybridflow.rollout.sampler import RowSampling, draw_uniform, sample_tokens
from hybridflow.rollout.stopping import StopChecker
from hybridflow.rollout.types import Completion, SamplingParams, validate_prompts


PREFILL_TOKEN_BUDGET = 4096
"""Most prompt tokens packed into one prefill pass on CPU (bounds its activation memory)."""
PREFILL_TOKEN_BUDGET_CUDA = 16384
"""The same on a GPU, where a pass is bound by its launches and weight reads until it is this wide."""


@dataclass
class Sequence:
    """One completion being generated."""

    prompt_index: int
    output_index: int
    prompt_length: int
    params: SamplingParams
    token_ids: list[int] = field(default_factory=list)
    prompt_ids: list[int] | None = None
    """The prompt's ids, kept only when finished sequences go to the prefix cache."""
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass
class PendingPrompt:
    """A prompt whose samples are not all admitted yet; its prefill is kept for them."""

    index: int
    token_ids: list[int]
    remaining: int
    params: SamplingParams
    prefix: torch.Tensor | None = None
    first_logits: torch.Tensor | None = None
    resumed: Sequence | None = None
    """A paused sequence this prompt continues (``token_ids`` is then its prompt plus its
    tokens so far, ``remaining`` is 1): the next sampled token is appended to it."""

    def start_sequence(self, output_index: int, *, keep_prompt: bool) -> Sequence:
        if self.resumed is not None:
            return self.resumed
        return Sequence(self.index, output_index, len(self.token_ids), self.params,
                        prompt_ids=self.token_ids if keep_prompt else None)


class NativeEngine:
    """``generate`` over a Llama-family HF model with continuous batching.

    Unlike the other backends it takes one ``SamplingParams`` per prompt (:attr:`takes_params_per_prompt`).

    Args:
        model: an HF ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` (its weights are used in place).
        tokenizer: needed only for stop strings.
        max_num_seqs: most sequences decoded at once (KV slots).
        max_model_len: context limit; defaults to ``config.max_position_embeddings``.
        decode_lanes: on CPU with more than one thread, decode wide steps in concurrent
            slices (:mod:`hybridflow.rollout.lanes`); same outputs, faster wide steps.
        prefix_cache_tokens: keep the KV of finished sequences, up to this many tokens, and
            prefill only the new part of a prompt that extends one (multi-turn rollouts);
            identical prompts in one call are prefilled once. 0 turns it off.
        enforce_eager: on CUDA, run every decode step eagerly instead of replaying CUDA graphs (verl's
            ``rollout.enforce_eager``; graphs are the default, as in verl HEAD).
        cudagraph_capture_sizes: on CUDA, the batch sizes to capture (verl's
            ``rollout.cudagraph_capture_sizes``); ``None`` = :data:`~hybridflow.rollout.cuda_graphs.CAPTURE_SIZES`.
        gpu_memory_utilization: on CUDA, the fraction of the GPU's memory that everything allocated in this
            process may reach once the KV cache is allocated (verl's ``rollout.gpu_memory_utilization``; the
            trainer passes it): the cache gets at most the slots that fit, and the other sequences wait for a
            free one. ``None``: no limit (``max_num_seqs`` slots).
        own_model: the engine owns ``model`` (a private copy nobody else runs): it then drops the
            module's projection weights once they are fused and packed, so the engine holds one
            copy of them, not two (~0.42 GB less for SmolLM2-135M in fp32); ``model``'s own forward
            no longer runs afterwards. The trainer's rollout copy is built this way.
    """

    takes_params_per_prompt = True
    """``generate`` accepts a list of ``SamplingParams``, one per prompt (the agent loops use it)."""

    def __init__(self, model, tokenizer=None, *, max_num_seqs: int = 256, max_model_len: int | None = None,
                 decode_lanes: bool = True, prefix_cache_tokens: int = 0, own_model: bool = False,
                 enforce_eager: bool = False, cudagraph_capture_sizes: list[int] | None = None,
                 gpu_memory_utilization: float | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len or model.config.max_position_embeddings
        reason = unsupported_reason(model.config, max_model_len=self.max_model_len)
        if reason is not None:
            raise RolloutError(f"the native engine does not run this model: {reason}; build it with "
                               "build_engine('native', ...) to fall back to HF generate, or set rollout.name=hf")
        self.decoder = LlamaFamilyDecoder(model)
        if own_model:
            self.decoder.release_module_projections()
        self.max_num_seqs = max_num_seqs
        self.cache: SlotKVCache | None = None
        threads = torch.get_num_threads()
        self.lanes = DecodeLanes(threads) if decode_lanes and self.device.type == "cpu" and threads > 1 else None
        self.prefix_cache = PrefixCache(prefix_cache_tokens) if prefix_cache_tokens > 0 else None
        # On CUDA the decode step runs as Triton kernels that read each row's length on the device, so
        # its shapes are static and CUDA graphs replay it; elsewhere SDPA runs over a host-sized span.
        self.triton_kernels = self.decoder.triton_kernels
        self.enforce_eager = enforce_eager or not self.triton_kernels
        self.capture_sizes = cudagraph_capture_sizes
        self.gpu_memory_utilization = gpu_memory_utilization
        self.graphs: DecodeGraphs | None = None

    @property
    def device(self) -> torch.device:
        return self.decoder.embed.device

    def load_weights(self, named_tensors) -> None:
        """Trainer weights (HF names) into the engine: copied into the fused copies in place where they can
        take them (CUDA: captured graphs stay valid), rebuilt where not (oneDNN-packed CPU weights)."""
        self.decoder.load_weights(named_tensors)
        if self.device.type == "cpu":
            return_freed_memory()  # the packing temporaries: ~0.4 GB resident otherwise (SmolLM2-135M)
        if self.prefix_cache is not None:
            self.prefix_cache.clear()  # computed with the old weights

    def generate(self, prompt_token_ids: list[list[int]],
                 params: SamplingParams | list[SamplingParams]) -> list[Completion]:
        """``n`` completions per prompt, grouped by prompt in input order.

        ``params`` is one ``SamplingParams`` for every prompt, or one per prompt (each request
        samples with its own temperature, filters, length and stops, in the same batch).
        """
        validate_prompts(prompt_token_ids, max_model_len=self.max_model_len)
        per_prompt = params_per_prompt(params, len(prompt_token_ids))
        capacity = min(self.max_model_len, max(len(p) + q.max_tokens for p, q in zip(prompt_token_ids, per_prompt)))
        cache = self._reserve(slots=min(self.max_num_seqs, sum(q.n for q in per_prompt)), max_len=capacity)
        self.decoder.rope_table(cache.max_len)  # once, rather than growing it step by step
        run = GenerationRun(
            cache=cache, generator=self._generator(next((q.seed for q in per_prompt if q.seed is not None), None)),
            tokenizer=self.tokenizer,
            waiting=deque(PendingPrompt(i, list(p), q.n, q)
                          for i, (p, q) in enumerate(zip(prompt_token_ids, per_prompt))),
            last_tokens=torch.empty(cache.slots, dtype=torch.long, device=self.device),
            prefix_cache=self.prefix_cache,
        )
        while run.waiting or run.live:
            self._admit(run)
            if run.live:
                self._step(run)
        run.done.sort(key=lambda s: (s.prompt_index, s.output_index))
        return [Completion(s.token_ids, s.logprobs if s.params.logprobs else None, s.finish_reason, s.prompt_index)
                for s in run.done]

    def _generator(self, seed: int | None) -> torch.Generator:
        generator = torch.Generator(device=self.device)
        seed = int(torch.randint(2**62, (1,)).item()) if seed is None else seed
        return generator.manual_seed(seed)

    def _reserve(self, *, slots: int, max_len: int) -> SlotKVCache:
        """Reuse the preallocated cache when it is large enough, else allocate a new one (on CUDA with at
        most the slots ``gpu_memory_utilization`` leaves room for: the rest wait and take slots as they free)."""
        dtype = self.decoder.embed.dtype
        slots = min(slots, self._slots_within_budget(max_len))
        if self.cache is None or not self.cache.fits(slots=slots, max_len=max_len, dtype=dtype, device=self.device):
            if self.triton_kernels and self.cache is not None:
                # Grow only, in whole splits: every new cache costs a fresh set of CUDA graphs.
                slots, max_len = max(slots, self.cache.slots), max(max_len, self.cache.max_len)
            max_len = self._cache_row_length(max_len)
            self.cache = self.graphs = None  # free the old ones before allocating
            self.cache = SlotKVCache(
                layers=self.decoder.num_layers, slots=slots, kv_heads=self.decoder.kv_heads, max_len=max_len,
                head_dim=self.decoder.head_dim, dtype=dtype, device=self.device,
            )
        return self.cache

    def _cache_row_length(self, max_len: int) -> int:
        """Positions a cache row gets: with the Triton kernels, whole attention splits (fewer caches, so fewer
        graph captures)."""
        if not self.triton_kernels:
            return max_len
        from hybridflow.rollout.triton_attention import SPLIT_LEN

        return min(self.max_model_len, -(-max_len // SPLIT_LEN) * SPLIT_LEN)

    def _slots_within_budget(self, max_len: int) -> int:
        """KV slots of ``max_len`` positions that fit in ``gpu_memory_utilization`` of the GPU, counting what is
        allocated now besides this engine's cache (weights, the trainer's tensors); no limit off CUDA."""
        if self.device.type != "cuda" or self.gpu_memory_utilization is None:
            return self.max_num_seqs
        total = torch.cuda.get_device_properties(self.device).total_memory
        own = 0 if self.cache is None else self.cache.data.numel() * self.cache.data.element_size()
        in_use = torch.cuda.memory_allocated(self.device) - own
        per_slot = (self.decoder.num_layers * 2 * self.decoder.kv_heads * self.decoder.head_dim
                    * self._cache_row_length(max_len) * self.decoder.embed.element_size())
        return kv_slots_within(budget=self.gpu_memory_utilization * total - in_use, per_slot=per_slot,
                               utilization=self.gpu_memory_utilization, total=total, max_len=max_len)

    def _decode(self, *, token_ids: torch.Tensor, positions: torch.Tensor, cache: SlotKVCache, context: int,
                first_slot: int) -> torch.Tensor:
        """``[N, V]`` logits of one decode step: replayed from a CUDA graph, or run eagerly."""
        if not self.triton_kernels:
            return self.decoder.decode(token_ids=token_ids, positions=positions, cache=cache, context=context,
                                       first_slot=first_slot)
        if self.enforce_eager:
            return self.decoder.decode(token_ids=token_ids, positions=positions, cache=cache, first_slot=first_slot)
        return self._graphs_for(cache)(token_ids=token_ids, positions=positions)

    def _graphs_for(self, cache: SlotKVCache) -> DecodeGraphs:
        if self.graphs is None or not self.graphs.valid_for(cache):
            self.graphs = DecodeGraphs(self.decoder, cache, capture_sizes=self.capture_sizes)
        return self.graphs

    def capture(self) -> None:
        """Allocate the KV cache at full size (``max_num_seqs`` x ``max_model_len``) and capture the CUDA graph
        of every batch bucket now, as vLLM does at start-up, rather than lazily in the first steps that need
        them. Nothing to do on CPU or with ``enforce_eager``."""
        if self.enforce_eager:
            return
        cache = self._reserve(slots=self.max_num_seqs, max_len=self.max_model_len)
        self.decoder.rope_table(cache.max_len)
        self._graphs_for(cache).capture_all()

    def _admit(self, run: GenerationRun) -> None:
        """Move waiting samples into free slots; a prompt is prefilled once for all its samples.

        Admission goes in waves: every waiting sample that fits takes a slot, and the first tokens of the
        whole wave are sampled in one call (one host sync, not one per prompt); samples that stop at their
        first token free their slots for the next wave."""
        while run.waiting and len(run.live) < run.cache.slots:
            if run.waiting[0].prefix is None:  # also when samples that stopped at once freed more slots
                self._prefill_admissible(run)
            wave = self._admission_wave(run)
            first_slot = slot = len(run.live)
            for pending, count in wave:
                run.cache.fill(first_slot=slot, count=count, prefix=pending.prefix)
                slot += count
            logits = torch.cat([pending.first_logits[None].expand(count, -1) for pending, count in wave])
            rows = RowSampling.of([pending.params for pending, count in wave for _ in range(count)],
                                  vocab_size=self.decoder.vocab_size, device=self.device)
            tokens, logprobs = sample_tokens(logits=logits, params=rows, generator=run.generator)
            run.last_tokens[first_slot:slot] = tokens
            drawn = zip(tokens.tolist(), logprobs.tolist())
            for pending, count in wave:
                output_start = pending.params.n - pending.remaining
                for offset, (token, logprob) in zip(range(count), drawn):
                    run.live.append(pending.start_sequence(output_start + offset,
                                                           keep_prompt=self.prefix_cache is not None))
                    run.append(run.live[-1], token, logprob)
                pending.remaining -= count
            run.retire()

    @staticmethod
    def _admission_wave(run: GenerationRun) -> list[tuple[PendingPrompt, int]]:
        """``(prompt, samples)`` taken from the front of the queue into the free slots, in order; a prompt
        whose samples do not all fit leads the next wave with the rest. Stops at the first prompt without
        a prefill (it is prefilled before the next wave)."""
        free, wave = run.cache.slots - len(run.live), []
        while run.waiting and free > 0 and run.waiting[0].prefix is not None:
            pending = run.waiting[0]
            count = min(pending.remaining, free)
            wave.append((pending, count))
            free -= count
            if count < pending.remaining:
                break
            run.waiting.popleft()
        return wave

    def _prefill_admissible(self, run: GenerationRun) -> None:
        """Prefill, in packed passes of at most :data:`PREFILL_TOKEN_BUDGET` tokens, every waiting
        prompt that gets a slot now and has no prefill yet."""
        free, batch, tokens = run.cache.slots - len(run.live), [], 0
        budget = PREFILL_TOKEN_BUDGET_CUDA if self.device.type == "cuda" else PREFILL_TOKEN_BUDGET
        for pending in run.waiting:
            if free <= 0:
                break
            free -= pending.remaining
            if pending.prefix is not None:
                continue
            if batch and tokens + len(pending.token_ids) > budget:
                self._prefill(batch)
                batch, tokens = [], 0
            batch.append(pending)
            tokens += len(pending.token_ids)
        if batch:
            self._prefill(batch)

    def _prefill(self, batch: list[PendingPrompt]) -> None:
        if self.prefix_cache is not None:
            return self._prefill_reusing(batch)
        prompts = [torch.tensor(p.token_ids, dtype=torch.long, device=self.device) for p in batch]
        for pending, (logits, prefix) in zip(batch, self.decoder.prefill_many(prompts)):
            pending.first_logits, pending.prefix = logits, prefix

    def _prefill_reusing(self, batch: list[PendingPrompt]) -> None:
        """Prefill each distinct prompt once, from its longest cached prefix when there is one."""
        groups: dict[tuple[int, ...], list[PendingPrompt]] = {}
        for pending in batch:
            groups.setdefault(tuple(pending.token_ids), []).append(pending)
        hits = [self.prefix_cache.longest_prefix(list(key)) for key in groups]
        new_tokens = [torch.tensor(key[length:], dtype=torch.long, device=self.device)
                      for key, (length, _) in zip(groups, hits)]
        results = self.decoder.prefill_many(new_tokens, computed=[kv for _, kv in hits])
        for group, (logits, prefix) in zip(groups.values(), results):
            for pending in group:
                pending.first_logits, pending.prefix = logits, prefix

    def _step(self, run: GenerationRun) -> None:
        """One decode step over every live slot (in lanes on CPU when there are enough of them)."""
        count = len(run.live)
        rows = run.row_sampling(vocab_size=self.decoder.vocab_size, device=self.device)
        # Drawn here for the whole batch, so the draws do not depend on how it is split.
        uniform = None if rows.all_greedy else draw_uniform(rows=count, generator=run.generator, device=self.device)
        if self.lanes is None:
            tokens, logprobs = self._decode_slots(run, 0, count, rows, uniform)
        else:
            parts = self.lanes.run(lambda start, stop: self._decode_slots(run, start, stop, rows, uniform), count)
            tokens, logprobs = (torch.cat(columns) for columns in zip(*parts))
        run.last_tokens[:count] = tokens
        for slot, (token, logprob) in enumerate(zip(tokens.tolist(), logprobs.tolist())):
            run.cache.lengths[slot] += 1
            run.append(run.live[slot], token, logprob)
        run.retire()

    def _decode_slots(self, run: GenerationRun, start: int, stop: int, rows: RowSampling,
                      uniform: torch.Tensor | None):
        """Decode and sample slots ``start .. stop - 1``; returns ``(tokens, logprobs)``."""
        positions_list = run.cache.lengths[start:stop]
        positions = torch.tensor(positions_list, dtype=torch.long, device=self.device)
        logits = self._decode(token_ids=run.last_tokens[start:stop], positions=positions, cache=run.cache,
                              context=max(positions_list) + 1, first_slot=start)
        return sample_tokens(logits=logits, params=rows.slice(start, stop),
                             uniform=None if uniform is None else uniform[start:stop])


@dataclass
class GenerationRun:
    """The state of one ``generate`` call: waiting prompts, live slots, finished sequences."""

    cache: SlotKVCache
    generator: torch.Generator
    tokenizer: object
    waiting: deque
    last_tokens: torch.Tensor
    """``[slots]`` each live slot's latest token (not yet in the cache)."""
    live: list[Sequence] = field(default_factory=list)
    """``live[i]`` occupies slot ``i``."""
    done: list[Sequence] = field(default_factory=list)
    prefix_cache: PrefixCache | None = None
    """Where finished sequences' KV goes (prompt + all generated tokens but the last, which was never fed back)."""
    stop_checkers: dict[int, StopChecker] = field(default_factory=dict)
    """One per distinct ``SamplingParams`` (by identity)."""
    _rows: RowSampling | None = None
    _rows_of: list[int] = field(default_factory=list)

    def stop_checker(self, params: SamplingParams) -> StopChecker:
        checker = self.stop_checkers.get(id(params))
        if checker is None:
            checker = self.stop_checkers[id(params)] = StopChecker(params=params, tokenizer=self.tokenizer)
        return checker

    def row_sampling(self, *, vocab_size: int, device) -> RowSampling:
        """The live slots' sampling parameters on the device; rebuilt only when the rows' params change."""
        key = [id(s.params) for s in self.live]
        if self._rows is None or key != self._rows_of:
            self._rows = RowSampling.of([s.params for s in self.live], vocab_size=vocab_size, device=device)
            self._rows_of = key
        return self._rows

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

    def retire(self) -> None:
        """Remove finished sequences, keeping live ones in slots ``0 .. len(live) - 1``.

        Going from the highest slot down, the current last slot is always live (or the
        finished one itself), so moving it into the hole keeps the prefix dense.
        """
        for slot in reversed(range(len(self.live))):
            if self.live[slot].finish_reason is None:
                continue
            self.done.append(self.live[slot])
            if self.prefix_cache is not None:
                self.keep_kv(slot)
            last = len(self.live) - 1
            if slot != last:
                self.cache.move(source=last, target=slot)
                self.last_tokens[slot] = self.last_tokens[last]
                self.live[slot] = self.live[last]
            self.live.pop()

    def keep_kv(self, slot: int) -> None:
        sequence, length = self.live[slot], self.cache.lengths[slot]
        token_ids = sequence.prompt_ids + sequence.token_ids[:-1]
        if len(token_ids) == length:  # a sequence cut at the context holds fewer
            self.prefix_cache.store(token_ids, self.cache.data[:, :, slot, :, :length].clone())


def params_per_prompt(params: SamplingParams | list[SamplingParams], prompts: int) -> list[SamplingParams]:
    """One ``SamplingParams`` per prompt: ``params`` repeated, or the list given (checked for length)."""
    if isinstance(params, SamplingParams):
        return [params] * prompts
    if len(params) != prompts:
        raise RolloutError(f"generate() got {len(params)} SamplingParams for {prompts} prompts; "
                           "pass one SamplingParams for all prompts or exactly one per prompt")
    return list(params)



def kv_slots_within(*, budget: float, per_slot: int, utilization: float, total: int, max_len: int) -> int:
    """How many KV slots of ``per_slot`` bytes fit in ``budget`` bytes; one line naming the fix when none does."""
    if budget < per_slot:
        gib = 2**30
        raise RolloutError(
            f"the KV cache of one sequence of {max_len} positions needs {per_slot / gib:.2f} GiB, but "
            f"rollout.gpu_memory_utilization={utilization} of {total / gib:.0f} GiB leaves {max(budget, 0) / gib:.2f} "
            "GiB after what is already allocated: raise rollout.gpu_memory_utilization, lower max_model_len "
            "(prompt_length + response_length), or offload the actor during rollout")
    return int(budget // per_slot)

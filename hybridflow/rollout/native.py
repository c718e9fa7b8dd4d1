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
from hybridflow.rollout.decoder import LlamaFamilyDecoder
from hybridflow.rollout.kv_cache import SlotKVCache
from hybridflow.rollout.lanes import DecodeLanes
from hybridflow.rollout.prefix_cache import PrefixCache
from hybridflow.rollout.sampler import draw_uniform, sample_tokens
from hybridflow.rollout.stopping import StopChecker
from hybridflow.rollout.types import Completion, SamplingParams, validate_prompts


PREFILL_TOKEN_BUDGET = 4096
"""Most prompt tokens packed into one prefill pass (bounds its activation memory)."""


@dataclass
class Sequence:
    """One completion being generated."""

    prompt_index: int
    output_index: int
    prompt_length: int
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
    prefix: torch.Tensor | None = None
    first_logits: torch.Tensor | None = None
    resumed: Sequence | None = None
    """A paused sequence this prompt continues (``token_ids`` is then its prompt plus its
    tokens so far, ``remaining`` is 1): the next sampled token is appended to it."""

    def start_sequence(self, output_index: int, *, keep_prompt: bool) -> Sequence:
        if self.resumed is not None:
            return self.resumed
        return Sequence(self.index, output_index, len(self.token_ids), prompt_ids=self.token_ids if keep_prompt else None)


class NativeEngine:
    """``generate`` over a Llama-family HF model with continuous batching.

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
        own_model: the engine owns ``model`` (a private copy nobody else runs): it then drops the
            module's projection weights once they are fused and packed, so the engine holds one
            copy of them, not two (~0.42 GB less for SmolLM2-135M in fp32); ``model``'s own forward
            no longer runs afterwards. The trainer's rollout copy is built this way.
    """

    def __init__(self, model, tokenizer=None, *, max_num_seqs: int = 256, max_model_len: int | None = None,
                 decode_lanes: bool = True, prefix_cache_tokens: int = 0, own_model: bool = False):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.decoder = LlamaFamilyDecoder(model)
        if own_model:
            self.decoder.release_module_projections()
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len or model.config.max_position_embeddings
        self.cache: SlotKVCache | None = None
        threads = torch.get_num_threads()
        self.lanes = DecodeLanes(threads) if decode_lanes and self.device.type == "cpu" and threads > 1 else None
        self.prefix_cache = PrefixCache(prefix_cache_tokens) if prefix_cache_tokens > 0 else None

    @property
    def device(self) -> torch.device:
        return self.decoder.embed.device

    def load_weights(self, named_tensors) -> None:
        """Trainer weights (HF names) into the engine: the fused copies are rebuilt from them."""
        self.decoder.load_weights(named_tensors)
        if self.device.type == "cpu":
            return_freed_memory()  # the packing temporaries: ~0.4 GB resident otherwise (SmolLM2-135M)
        if self.prefix_cache is not None:
            self.prefix_cache.clear()  # computed with the old weights

    def generate(self, prompt_token_ids: list[list[int]], params: SamplingParams) -> list[Completion]:
        """``n`` completions per prompt, grouped by prompt in input order."""
        validate_prompts(prompt_token_ids, max_model_len=self.max_model_len)
        capacity = min(self.max_model_len, max(map(len, prompt_token_ids)) + params.max_tokens)
        cache = self._reserve(slots=min(self.max_num_seqs, len(prompt_token_ids) * params.n), max_len=capacity)
        self.decoder.rope_table(capacity)  # once, rather than growing it step by step
        run = GenerationRun(
            params=params, cache=cache, generator=self._generator(params.seed),
            stop=StopChecker(params=params, tokenizer=self.tokenizer),
            waiting=deque(PendingPrompt(i, list(p), params.n) for i, p in enumerate(prompt_token_ids)),
            last_tokens=torch.empty(cache.slots, dtype=torch.long, device=self.device),
            prefix_cache=self.prefix_cache,
        )
        while run.waiting or run.live:
            self._admit(run)
            if run.live:
                self._step(run)
        run.done.sort(key=lambda s: (s.prompt_index, s.output_index))
        return [Completion(s.token_ids, s.logprobs if params.logprobs else None, s.finish_reason, s.prompt_index)
                for s in run.done]

    def _generator(self, seed: int | None) -> torch.Generator:
        generator = torch.Generator(device=self.device)
        seed = int(torch.randint(2**62, (1,)).item()) if seed is None else seed
        return generator.manual_seed(seed)

    def _reserve(self, *, slots: int, max_len: int) -> SlotKVCache:
        """Reuse the preallocated cache when it is large enough, else allocate a new one."""
        dtype = self.decoder.embed.dtype
        if self.cache is None or not self.cache.fits(slots=slots, max_len=max_len, dtype=dtype, device=self.device):
            self.cache = None  # free the old one before allocating
            self.cache = SlotKVCache(
                layers=self.decoder.num_layers, slots=slots, kv_heads=self.decoder.kv_heads, max_len=max_len,
                head_dim=self.decoder.head_dim, dtype=dtype, device=self.device,
            )
        return self.cache

    def _admit(self, run: GenerationRun) -> None:
        """Move waiting samples into free slots; a prompt is prefilled once for all its samples."""
        while run.waiting and len(run.live) < run.cache.slots:
            pending = run.waiting[0]
            if pending.prefix is None:  # also when samples that stopped at once freed more slots
                self._prefill_admissible(run)
            count = min(pending.remaining, run.cache.slots - len(run.live))
            first_slot = len(run.live)
            run.cache.fill(first_slot=first_slot, count=count, prefix=pending.prefix)
            logits = pending.first_logits[None].expand(count, -1)
            tokens, logprobs = sample_tokens(logits=logits, params=run.params, generator=run.generator)
            run.last_tokens[first_slot : first_slot + count] = tokens
            output_start = run.params.n - pending.remaining
            for offset, (token, logprob) in enumerate(zip(tokens.tolist(), logprobs.tolist())):
                run.live.append(pending.start_sequence(output_start + offset, keep_prompt=self.prefix_cache is not None))
                run.append(run.live[-1], token, logprob)
            pending.remaining -= count
            if pending.remaining == 0:
                run.waiting.popleft()
            run.retire()

    def _prefill_admissible(self, run: GenerationRun) -> None:
        """Prefill, in packed passes of at most :data:`PREFILL_TOKEN_BUDGET` tokens, every waiting
        prompt that gets a slot now and has no prefill yet."""
        free, batch, tokens = run.cache.slots - len(run.live), [], 0
        for pending in run.waiting:
            if free <= 0:
                break
            free -= pending.remaining
            if pending.prefix is not None:
                continue
            if batch and tokens + len(pending.token_ids) > PREFILL_TOKEN_BUDGET:
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
        # Drawn here for the whole batch, so the draws do not depend on how it is split.
        uniform = None if run.params.greedy else draw_uniform(rows=count, generator=run.generator, device=self.device)
        if self.lanes is None:
            tokens, logprobs = self._decode_slots(run, 0, count, uniform)
        else:
            parts = self.lanes.run(lambda start, stop: self._decode_slots(run, start, stop, uniform), count)
            tokens, logprobs = (torch.cat(columns) for columns in zip(*parts))
        run.last_tokens[:count] = tokens
        for slot, (token, logprob) in enumerate(zip(tokens.tolist(), logprobs.tolist())):
            run.cache.lengths[slot] += 1
            run.append(run.live[slot], token, logprob)
        run.retire()

    def _decode_slots(self, run: GenerationRun, start: int, stop: int, uniform: torch.Tensor | None):
        """Decode and sample slots ``start .. stop - 1``; returns ``(tokens, logprobs)``."""
        positions_list = run.cache.lengths[start:stop]
        positions = torch.tensor(positions_list, dtype=torch.long, device=self.device)
        logits = self.decoder.decode(token_ids=run.last_tokens[start:stop], positions=positions, cache=run.cache,
                                     context=max(positions_list) + 1, first_slot=start)
        return sample_tokens(logits=logits, params=run.params,
                             uniform=None if uniform is None else uniform[start:stop])


@dataclass
class GenerationRun:
    """The state of one ``generate`` call: waiting prompts, live slots, finished sequences."""

    params: SamplingParams
    cache: SlotKVCache
    generator: torch.Generator
    stop: StopChecker
    waiting: deque
    last_tokens: torch.Tensor
    """``[slots]`` each live slot's latest token (not yet in the cache)."""
    live: list[Sequence] = field(default_factory=list)
    """``live[i]`` occupies slot ``i``."""
    done: list[Sequence] = field(default_factory=list)
    prefix_cache: PrefixCache | None = None
    """Where finished sequences' KV goes (prompt + all generated tokens but the last, which was never fed back)."""

    def append(self, sequence: Sequence, token: int, logprob: float) -> None:
        """Record a sampled token and decide whether the sequence has finished."""
        sequence.token_ids.append(token)
        sequence.logprobs.append(logprob)
        if self.stop.is_stop(sequence.token_ids):
            sequence.finish_reason = "stop"
        elif (len(sequence.token_ids) >= self.params.max_tokens
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

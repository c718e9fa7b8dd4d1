"""The native generation engine: a paged KV cache with continuous batching and preemption, in nano-vllm's shape.

One engine step (``RequestQueue.step``) is :meth:`NativeEngine.admit` then :meth:`NativeEngine.step`: the
scheduler plans (:mod:`hybridflow.rollout.scheduler`: which prompts prefill how far, which samples join, what is
preempted when blocks run out), the model runner executes (:mod:`hybridflow.rollout.model_runner`: prefill passes,
sampling, the decode step), the run records the results (:mod:`hybridflow.rollout.generation_run`), and the KV
memory lives in :mod:`hybridflow.rollout.kv_pool`.

What it does that HF ``generate`` does not: a prompt is prefilled once and its ``n`` samples share its blocks
(:mod:`hybridflow.rollout.block_manager`); a finished row is retired at once and a waiting one takes its place;
when blocks run out the latest admitted row is preempted and recomputed later (never out of memory); finished
turns' blocks can stay named for the next turn (``prefix_cache_tokens``); long prompts prefill in chunks within a
step's token budget (``enable_chunked_prefill``); and with ``overlap_steps`` one decode step stays in flight while
the host does the previous one's bookkeeping. Sampling runs on the device, seeded from ``SamplingParams.seed``
(or per request and token with ``keyed_draws``), so a fixed seed gives the same outputs.
"""

from __future__ import annotations

import weakref
from collections import deque

import torch

from hybridflow.cpu import return_freed_memory
from hybridflow.errors import RolloutError
from hybridflow.models.vision import check_image_tokens
from hybridflow.rollout.architectures import ARCHITECTURES, unsupported_reason
from hybridflow.rollout.block_manager import BlockAllocator
from hybridflow.rollout.cuda_graphs import DecodeGraphs
from hybridflow.rollout.decoder import LlamaFamilyDecoder
from hybridflow.rollout.generation_run import (GenerationRun, HostBlockTables, PendingPrompt, Sequence, StepClock,
                                               join_wave)
from hybridflow.rollout.kv_cache import PagedKVCache, SlotMirror
from hybridflow.rollout.kv_pool import KVPool, device_memory, kv_blocks_within
from hybridflow.rollout.lanes import DecodeLanes
from hybridflow.rollout.mla import MLADecoder
from hybridflow.rollout.model_runner import ModelRunner
from hybridflow.rollout.request_queue import RequestQueue
from hybridflow.rollout.scheduler import (admission_wave, blocks_for_next_writes, check_token_budget, chunk_end,
                                         head_waits, held_prefill, plan_prefill, prefill_allowance, schedule_writes,
                                         share_prefills)
from hybridflow.rollout.types import Completion, SamplingParams, validate_prompts
from hybridflow.rollout.vision_prefill import Encoded, PromptImages, encode_prompt_images

__all__ = ["GenerationRun", "NativeEngine", "PendingPrompt", "Sequence", "check_token_budget", "chunk_end",
           "device_memory", "kv_blocks_within"]  # re-exported

PREFILL_TOKEN_BUDGET = 4096
"""Most tokens of one engine step (chunked prefill) or one packed prefill pass (whole prompts) on CPU when
``max_num_batched_tokens`` is not given (bounds a pass's activation memory)."""
PREFILL_TOKEN_BUDGET_CUDA = 16384
"""The same on a GPU, where a pass is bound by its launches and weight reads until it is this wide."""


class NativeEngine:
    """``generate`` over an HF model of the architecture table with a paged KV cache and continuous batching.

    It takes one ``SamplingParams`` per prompt (its registry entry declares ``params_per_prompt``).

    Args:
        model: an HF causal LM of :mod:`hybridflow.rollout.architectures` (its weights are used in place).
        tokenizer: needed only for stop strings.
        max_num_seqs: most sequences decoded at once.
        max_model_len: context limit; defaults to ``config.max_position_embeddings``.
        decode_lanes: on CPU with more than one thread, decode wide steps in concurrent slices (same outputs).
        prefix_cache_tokens: keep finished sequences' blocks, named by their tokens, up to this many tokens, and
            prefill only the new part of a prompt that starts with them (multi-turn); 0 turns it off.
        enforce_eager: on CUDA, run decode steps eagerly instead of replaying CUDA graphs (verl's key).
        cudagraph_capture_sizes: on CUDA, the batch sizes to capture (verl's key); ``None`` = the default buckets.
        gpu_memory_utilization: the fraction of the device's memory (on CPU: RAM) this process may reach once the
            KV cache is allocated (verl's key); past it sequences are preempted. ``None``: no limit.
        num_kv_blocks: the number of KV blocks, overriding the budget (vLLM's ``num_gpu_blocks_override``).
        max_num_batched_tokens: tokens one engine step (chunked prefill) or one packed prefill pass may compute
            (verl's key); ``None`` = :data:`PREFILL_TOKEN_BUDGET` (:data:`PREFILL_TOKEN_BUDGET_CUDA` on CUDA).
        enable_chunked_prefill: prefill waiting prompts in chunks within each step's token budget, beside the live
            rows' decode (verl's key); the budget must then exceed ``max_num_seqs``.
        overlap_steps: keep one decode step in flight (vLLM's async scheduling): step ``k + 1`` is launched from
            step ``k``'s samples on the device before the host reads step ``k`` back; same outputs (greedy or keyed
            draws). ``None``: on where the decode step runs as the CUDA kernels (nothing to overlap on CPU).
        own_model: the engine owns ``model`` (nobody else runs it): the module's projection weights are dropped
            once packed (one copy, not two); the trainer's rollout copy is built this way.
    """

    def __init__(self, model, tokenizer=None, *, max_num_seqs: int = 256, max_model_len: int | None = None,
                 decode_lanes: bool = True, prefix_cache_tokens: int = 0, own_model: bool = False,
                 enforce_eager: bool = False, cudagraph_capture_sizes: list[int] | None = None,
                 gpu_memory_utilization: float | None = None, num_kv_blocks: int | None = None,
                 max_num_batched_tokens: int | None = None, enable_chunked_prefill: bool = False,
                 overlap_steps: bool | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len or model.config.get_text_config().max_position_embeddings
        reason = unsupported_reason(model.config, max_model_len=self.max_model_len)
        if reason is not None:
            raise RolloutError(f"the native engine does not run this model: {reason}; build it with "
                               "build_engine('native', ...) to fall back to HF generate, or set rollout.name=hf")
        self.decoder = native_decoder(model)
        if own_model:
            self.decoder.release_module_projections()
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunked_prefill = enable_chunked_prefill
        check_token_budget(self.token_budget, max_num_seqs=max_num_seqs, chunked=enable_chunked_prefill)
        self.encoded_images: dict[int, Encoded] = {}
        """The vision tower's output by image name, kept until the weights change or a batch starts (an agent loop's
        turns carry its conversation's images again)."""
        self.preemptions = 0
        """Sequences preempted (their blocks freed, recomputed later) since the engine was built."""
        threads = torch.get_num_threads()
        self.lanes = DecodeLanes(threads) if decode_lanes and self.device.type == "cpu" and threads > 1 else None
        # On CUDA the decode step runs as Triton kernels that read each row's length and blocks on the device,
        # so its shapes are static and CUDA graphs replay it; elsewhere SDPA runs over the gathered blocks.
        self.triton_kernels = self.decoder.triton_kernels
        self.enforce_eager = enforce_eager or not self.triton_kernels
        self.overlap_steps = self.triton_kernels if overlap_steps is None else overlap_steps
        self.step_clock: StepClock | None = None
        """Set by a benchmark: the runs opened afterwards time their steps' host gaps into it."""
        self.runner = ModelRunner(self.decoder, lanes=self.lanes, enforce_eager=self.enforce_eager,
                                  capture_sizes=cudagraph_capture_sizes)
        self.pool = KVPool(self.decoder, max_model_len=self.max_model_len, prefix_cache_tokens=prefix_cache_tokens,
                           num_kv_blocks=num_kv_blocks, gpu_memory_utilization=gpu_memory_utilization,
                           on_new_pool=self.runner.drop_graphs)
        self.open_runs: weakref.WeakSet[GenerationRun] = weakref.WeakSet()
        """The runs over the KV cache not closed yet (a ``generate``'s queue until it returns, an agent rollout's
        queue, a streaming session): :meth:`release_kv_cache` leaves the cache to them."""
        self.kv_high_water = 0
        """The most bytes :attr:`kv_cache_bytes` reached since :meth:`reset_kv_high_water` (benchmarks read it
        per phase)."""
        _ENGINES.add(self)

    @property
    def device(self) -> torch.device:
        return self.decoder.embed.device

    @property
    def graphs(self) -> DecodeGraphs | None:
        """The runner's CUDA graphs over the current pool (``None`` until a step captures them)."""
        return self.runner.graphs

    @graphs.setter
    def graphs(self, graphs: DecodeGraphs | None) -> None:
        self.runner.graphs = graphs

    @property
    def cache(self) -> PagedKVCache | None:
        """The KV block pool (:class:`~hybridflow.rollout.kv_pool.KVPool`); ``None`` until a run reserves it."""
        return self.pool.cache

    @property
    def allocator(self) -> BlockAllocator | None:
        return self.pool.allocator

    @property
    def mirror(self) -> SlotMirror | None:
        return self.pool.mirror

    @property
    def token_budget(self) -> int:
        """Tokens of one step (chunked prefill) or one prefill pass: ``max_num_batched_tokens``, or the device's
        default."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return PREFILL_TOKEN_BUDGET_CUDA if self.device.type == "cuda" else PREFILL_TOKEN_BUDGET

    def load_weights(self, named_tensors) -> None:
        """Trainer weights (HF names) into the engine: copied into the fused copies in place where they can
        take them (CUDA: captured graphs stay valid), rebuilt where not (oneDNN-packed CPU weights)."""
        self.decoder.load_weights(named_tensors)
        if self.device.type == "cpu":
            return_freed_memory()  # the packing temporaries: ~0.4 GB resident otherwise (SmolLM2-135M)
        self.reset_prefix_cache()  # cached blocks were computed with the old weights

    def reset_prefix_cache(self) -> None:
        """Forget every named block (vLLM's ``reset_prefix_cache``). The rollout worker calls it at the start of
        every batch: a prefill from cached blocks sums in another order, so a batch is bitwise the same whatever ran
        before it (a resumed run included) only when it starts with no names."""
        self.encoded_images.clear()  # the tower's outputs too: a batch's images are encoded as they were first
        if self.allocator is not None:
            self.allocator.drop_names()

    def release_kv_cache(self) -> bool:
        """Give the KV cache's memory back while nothing generates (verl's ``rollout.free_cache_engine``: the pool is
        the memory the actor's update needs); returns whether it is released, ``False`` while a run still holds it.

        Drops the block pool (named blocks too), the CPU slot mirror and the CUDA graphs (they read the pool's
        addresses); weights and compiled kernels stay. The next run allocates the pool again within
        ``gpu_memory_utilization`` and captures each graph bucket again at first use (cost: docs/benchmarks.md).
        """
        if len(self.open_runs):
            return False
        self.pool.release()
        self.graphs = None
        self.encoded_images.clear()  # the vision tower's outputs of the rollout just ended
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        else:
            return_freed_memory()
        return True

    def close_run(self, run: GenerationRun) -> None:
        """``run`` no longer uses the KV cache (its queue or session closed): :meth:`release_kv_cache` may free it."""
        self.open_runs.discard(run)

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes allocated for the KV cache now (:attr:`KVPool.bytes`)."""
        return self.pool.bytes

    def reset_kv_high_water(self) -> None:
        """Start a new window of :attr:`kv_high_water` at what is held now."""
        self.kv_high_water = self.kv_cache_bytes

    def _note_kv_bytes(self) -> None:
        self.kv_high_water = max(self.kv_high_water, self.kv_cache_bytes)

    def generate(self, prompt_token_ids: list[list[int]], params: SamplingParams | list[SamplingParams], *,
                 multi_modal_inputs: list[dict | None] | None = None) -> list[Completion]:
        """``n`` completions per prompt, grouped by prompt in input order.

        ``params`` is one ``SamplingParams`` for every prompt, or one per prompt (each request
        samples with its own temperature, filters, length and stops, in the same batch).
        ``multi_modal_inputs``: a vision-language model's images, one dict (``pixel_values``, ``image_grid_thw``)
        or None per prompt, as the HF engine takes them (:meth:`encode_images`).
        """
        validate_prompts(prompt_token_ids, max_model_len=self.max_model_len)
        per_prompt = params_per_prompt(params, len(prompt_token_ids))
        capacity = min(self.max_model_len, max(len(p) + q.max_tokens for p, q in zip(prompt_token_ids, per_prompt)))
        queue = RequestQueue(self, max_len=capacity, sequences=sum(q.n for q in per_prompt),
                             seed=next((q.seed for q in per_prompt if q.seed is not None), None))
        images = self.encode_images(prompt_token_ids, multi_modal_inputs)
        try:
            requests = [queue.submit(p, q, images=i) for p, q, i in zip(prompt_token_ids, per_prompt, images)]
            queue.drain()
        finally:
            queue.close()  # the cache is free to release once this returns
        return [completion for request in requests for completion in request.future.result()]

    def encode_images(self, prompt_token_ids: list[list[int]],
                      multi_modal_inputs: list[dict | None] | None) -> list[PromptImages | None]:
        """Each prompt's images through the model's vision tower (one pass for all of them), with their M-RoPE
        positions: what :meth:`RequestQueue.submit` takes as ``images`` (None for a prompt without images)."""
        return encode_prompt_images(self.model, prompt_token_ids, multi_modal_inputs, encoded=self.encoded_images)

    def new_run(self, *, sequences: int, max_len: int, seed: int | None) -> GenerationRun:
        """An empty :class:`GenerationRun` over a cache reserved for ``sequences`` sequences of ``max_len``; at most
        ``min(max_num_seqs, sequences)`` of them decode at once (no more can be live)."""
        rows = min(self.max_num_seqs, sequences)
        cache = self.pool.reserve(sequences=rows, max_len=max_len)
        self.decoder.rope_table(cache.max_len)  # once, rather than growing it step by step
        run = GenerationRun(cache=cache, allocator=self.allocator, generator=self._generator(seed),
                            tokenizer=self.tokenizer, waiting=deque(), max_num_seqs=rows,
                            vocab_size=self.decoder.vocab_size,
                            tables=HostBlockTables(rows=rows, width=cache.table_width),
                            mirror=self.pool.mirror_for(cache, rows), clock=self.step_clock)
        self._note_kv_bytes()
        self.open_runs.add(run)  # until its queue closes (close_run)
        return run

    def _generator(self, seed: int | None) -> torch.Generator:
        generator = torch.Generator(device=self.device)
        seed = int(torch.randint(2**62, (1,)).item()) if seed is None else seed
        return generator.manual_seed(seed)

    def _graphs_for(self, cache: PagedKVCache) -> DecodeGraphs:
        return self.runner.graphs_for(cache, rows=self.max_num_seqs)

    def capture(self) -> None:
        """Allocate the KV cache at full size (``max_num_seqs`` x ``max_model_len``) and capture the CUDA graph
        of every batch bucket now, as vLLM does at start-up, rather than lazily in the first steps that need
        them. Nothing to do on CPU or with ``enforce_eager``."""
        if self.enforce_eager:
            return
        cache = self.pool.reserve(sequences=self.max_num_seqs, max_len=self.max_model_len)
        self._note_kv_bytes()
        self.decoder.rope_table(cache.max_len)
        self._graphs_for(cache).capture_all()

    def admit(self, run: GenerationRun) -> None:
        """The first half of one engine step (:class:`~hybridflow.rollout.request_queue.StepEngine`): :meth:`_admit`."""
        self._admit(run)

    def step(self, run: GenerationRun) -> None:
        """The second half of one engine step: :meth:`_step` (one decode step over every live row)."""
        self._step(run)

    def check_prompt_images(self, prompt_ids: list[int]) -> None:
        """A vision-language model's prompt given without images must hold no image tokens."""
        if self.decoder.vision_language:
            check_image_tokens(self.model, [], torch.tensor([list(prompt_ids)]))

    def _admit(self, run: GenerationRun) -> None:
        """Prefill waiting prompts (once for all their samples) and move their samples into the batch, in admission
        waves (:func:`~hybridflow.rollout.scheduler.admission_wave`) whose first tokens are sampled in one call. With
        chunked prefill this is the prefill half of one engine step: it spends what the step's token budget leaves
        after one decode token per live row, and a prompt it could not finish goes on at the next step."""
        run.step_prefill = run.step_decode = 0
        if run.waiting:  # who joins depends on who ended: the step in flight lands first (as without overlap)
            run.land_in_flight()
        while run.waiting and len(run.live) < run.max_num_seqs:
            if not run.waiting[0].ready:  # also when samples that stopped at once freed more room
                allowance = prefill_allowance(run, token_budget=self.token_budget, chunked=self.chunked_prefill)
                if allowance <= 0:
                    return  # the step's budget is spent: the head's next chunk comes at the next step
                self._prefill_admissible(run, allowance)
            wave = admission_wave(run)
            if not wave:
                if head_waits(run):
                    return
                held = held_prefill(run)
                if held is None:
                    raise RolloutError(f"no KV block is left for a prompt of {len(run.waiting[0].token_ids)} tokens "
                                       "with nothing running: raise num_kv_blocks or gpu_memory_utilization")
                held.drop_prefill()
                continue
            self._join(run, wave)

    def _join(self, run: GenerationRun, wave: list[tuple[PendingPrompt, int]]) -> None:
        """Sample the first token of every sample in ``wave`` from its prompt's last logits and add it to the batch."""
        tokens, logprobs = self.runner.sample_first_tokens(run, wave)
        join_wave(run, wave, tokens, logprobs)

    def _prefill_admissible(self, run: GenerationRun, allowance: float) -> None:
        """Plan the prefill of the prompts that get a row now (:func:`~hybridflow.rollout.scheduler.plan_prefill`),
        run it, and let copies of a prompt share its prefill."""
        plan = plan_prefill(run, allowance)
        self.runner.prefill(run, plan.chunks, token_budget=self.token_budget)
        share_prefills(plan)

    def _step(self, run: GenerationRun) -> None:
        """One decode step over every live sequence. With :attr:`overlap_steps` it is launched before the previous
        step is read back and left in flight; the previous step lands first instead when too few blocks are free for
        every row's next write (it may preempt), and a step whose every row ends lands at once."""
        previous = run.in_flight
        if previous is not None and not blocks_for_next_writes(run):
            run.land_in_flight()
            previous = None
        run.cache.copy_blocks(schedule_writes(run))  # no preemption with a step in flight: checked above
        ended = all(run.ended_ahead(s) for s in run.live)
        launched = None if ended else self.runner.launch(run, self.cache, rows=self.max_num_seqs)
        run.in_flight = None
        if previous is not None:
            run.land(previous)
        if launched is None:
            return
        if self.overlap_steps and not all(s.finish_reason is not None or run.ended_ahead(s) for s in launched.rows):
            run.in_flight = launched
        else:
            run.land(launched)


_ENGINES: weakref.WeakSet[NativeEngine] = weakref.WeakSet()


def live_engines() -> list[NativeEngine]:
    """This process's native engines (a benchmark reads their KV cache bytes phase by phase)."""
    return list(_ENGINES)


def params_per_prompt(params: SamplingParams | list[SamplingParams], prompts: int) -> list[SamplingParams]:
    """One ``SamplingParams`` per prompt: ``params`` repeated, or the list given (checked for length)."""
    if isinstance(params, SamplingParams):
        return [params] * prompts
    if len(params) != prompts:
        raise RolloutError(f"generate() got {len(params)} SamplingParams for {prompts} prompts; "
                           "pass one SamplingParams for all prompts or exactly one per prompt")
    return list(params)


def native_decoder(model) -> LlamaFamilyDecoder | MLADecoder:
    """The decoder of the model's row in the architecture table: latent attention's own (DeepSeek-V3), else
    :class:`LlamaFamilyDecoder`."""
    if ARCHITECTURES[model.config.model_type].attention == "mla":
        return MLADecoder(model)
    return LlamaFamilyDecoder(model)

"""The native generation engine: a paged KV cache with continuous batching and preemption.

Where HF ``generate`` loses time in RL rollouts, and what this engine does instead:

- it prefills each prompt ``n`` times (``num_return_sequences`` repeats the prompt);
  here a prompt is prefilled once and its ``n`` samples share its KV blocks (copy-on-write
  of the partial last block; :mod:`hybridflow.rollout.block_manager`);
- a finished sequence keeps being computed, as padding, until the longest one ends;
  here it is retired at once and a waiting sequence takes its place (continuous
  batching), so every step computes only live sequences;
- its dynamic cache grows by concatenation and is sized for the longest sequence;
  here a pool of fixed-size blocks is preallocated once, a sequence takes a block every
  :data:`~hybridflow.rollout.block_manager.BLOCK_SIZE` tokens, and when none is left the
  most recently admitted sequence is *preempted*: its blocks are freed and it waits at the
  front of the queue, to be prefilled again from its prompt and its tokens so far and to
  continue where it stopped (recompute; the engine never runs out of memory);
- with ``prefix_cache_tokens``, the blocks of finished turns stay named by their tokens, and
  the next turn of a conversation starts from them instead of prefilling them again;
- with ``enable_chunked_prefill``, each engine step spends at most ``max_num_batched_tokens`` tokens: one
  decode token per live row first, then chunks of waiting prompts with what is left. A prompt longer than that
  is prefilled over several steps, each chunk attending to the earlier ones through its blocks, and joins the
  batch after its last chunk, so a long prompt never stalls the live rows' decode for more than one budget;
- HF ``generate`` reads each step's tokens back before it launches the next, and so did this engine: the device
  idles while the host appends tokens, checks stops, retires rows and builds the next inputs. With
  ``overlap_steps`` (on by default where the decode step runs as the CUDA kernels) one step stays in flight: step
  ``k + 1`` is launched with its input tokens taken on the device from step ``k``'s samples, then step ``k`` is
  read back (one packed copy that does not wait for step ``k + 1``) and its bookkeeping done while step ``k + 1``
  runs. A row that step ``k`` ended is decoded once more and that token dropped; steps that admit prompts or may
  preempt wait for the step in flight first, so the outputs are the synchronous steps' (greedy, keyed draws).

One engine step (``RequestQueue.step``): ``_admit`` (prefill waiting prompts, sample their first tokens, join them;
with a prompt waiting, it lands the step in flight first), then ``_step``: give every row a block for its next write, launch the decode
step, land the step before it (or this one, without ``overlap_steps``).

Sampling runs on the device with a ``torch.Generator`` seeded from
``SamplingParams.seed``, so a fixed seed and the same inputs give the same outputs; a run with
``keyed_draws`` draws each token from its request's seed and its token index instead, so it does not
depend on which requests shared its steps. ``generate`` submits its prompts to a
:class:`~hybridflow.rollout.request_queue.RequestQueue` and drains it: the streaming sessions and the
agent loops' turns go through the same queue and the same ``_admit`` / ``_step``.
"""

from __future__ import annotations

import math
import os
import weakref
from collections import deque

import torch

from hybridflow.cpu import return_freed_memory
from hybridflow.errors import RolloutError
from hybridflow.models.vision import check_image_tokens
from hybridflow.rollout.architectures import unsupported_reason
from hybridflow.rollout.block_manager import BLOCK_SIZE, BlockAllocator
from hybridflow.rollout.cuda_graphs import DecodeGraphs
from hybridflow.rollout.decoder import LlamaFamilyDecoder
from hybridflow.rollout.generation_run import (GenerationRun, HostBlockTables, PendingPrompt, Sequence,
                                               StepClock)
from hybridflow.rollout.kv_cache import PagedKVCache, SlotMirror
from hybridflow.rollout.lanes import DecodeLanes
from hybridflow.rollout.model_runner import ModelRunner
from hybridflow.rollout.request_queue import RequestQueue
from hybridflow.rollout.scheduler import (admission_wave, blocks_for_next_writes, check_token_budget, chunk_end,
                                         plan_prefill, share_prefills)
from hybridflow.rollout.types import Completion, SamplingParams, validate_prompts
from hybridflow.rollout.vision_prefill import Encoded, PromptImages, encode_prompt_images

__all__ = ["GenerationRun", "NativeEngine", "PendingPrompt", "Sequence", "check_token_budget", "chunk_end"]  # re-exported

PREFILL_TOKEN_BUDGET = 4096
"""Most tokens of one engine step (chunked prefill) or one packed prefill pass (whole prompts) on CPU when
``max_num_batched_tokens`` is not given (bounds a pass's activation memory)."""
PREFILL_TOKEN_BUDGET_CUDA = 16384
"""The same on a GPU, where a pass is bound by its launches and weight reads until it is this wide."""


class NativeEngine:
    """``generate`` over a Llama-family HF model with a paged KV cache and continuous batching.

    Unlike the other backends it takes one ``SamplingParams`` per prompt (:attr:`takes_params_per_prompt`).

    Args:
        model: an HF ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` (its weights are used in place).
        tokenizer: needed only for stop strings.
        max_num_seqs: most sequences decoded at once.
        max_model_len: context limit; defaults to ``config.max_position_embeddings``.
        decode_lanes: on CPU with more than one thread, decode wide steps in concurrent
            slices (:mod:`hybridflow.rollout.lanes`); same outputs, faster wide steps.
        prefix_cache_tokens: keep the blocks of finished sequences, named by their tokens, up to this many
            tokens, and prefill only the new part of a prompt that starts with them (multi-turn rollouts;
            :mod:`hybridflow.rollout.block_manager`). 0 turns it off (a prompt's samples still share its blocks).
        enforce_eager: on CUDA, run every decode step eagerly instead of replaying CUDA graphs (verl's
            ``rollout.enforce_eager``; graphs are the default, as in verl HEAD).
        cudagraph_capture_sizes: on CUDA, the batch sizes to capture (verl's
            ``rollout.cudagraph_capture_sizes``); ``None`` = :data:`~hybridflow.rollout.cuda_graphs.CAPTURE_SIZES`.
        gpu_memory_utilization: the fraction of the device's memory that everything allocated in this process
            may reach once the KV cache is allocated (verl's ``rollout.gpu_memory_utilization``; the trainer passes
            it): on CUDA of the GPU's memory, on CPU of the machine's RAM (this process's resident memory counting
            as used). The cache gets at most the blocks that fit; when they run out, sequences are preempted and
            recomputed later. ``None``: no limit (blocks for ``max_num_seqs`` sequences of the longest length).
        num_kv_blocks: the number of KV blocks, overriding the budget (vLLM's ``num_gpu_blocks_override``; tests
            use it to force preemption); at least one longest sequence's worth plus the null block.
        max_num_batched_tokens: tokens one engine step may compute (verl's ``rollout.max_num_batched_tokens``);
            ``None`` = :data:`PREFILL_TOKEN_BUDGET` (:data:`PREFILL_TOKEN_BUDGET_CUDA` on CUDA). With chunked prefill,
            the step's decode tokens (one a live row, and one for each sample that joins in it) plus its prefill
            chunks; without, the prompt tokens of one packed prefill pass (a longer prompt gets a pass of its own).
        enable_chunked_prefill: prefill waiting prompts in chunks within each step's token budget, beside the
            live rows' decode, instead of whole before the step (verl's ``rollout.enable_chunked_prefill``; the
            trainer passes it, default on there). The budget must then exceed ``max_num_seqs``.
        overlap_steps: keep one decode step in flight (vLLM's async scheduling, SGLang's overlap scheduler): step
            ``k + 1`` is launched with its input tokens taken on the device from step ``k``'s samples, before the host
            reads step ``k``'s tokens back (one packed copy that does not wait for step ``k + 1``), so the host's
            bookkeeping of step ``k`` (stop checks, retiring rows, blocks, the next inputs) runs while the device
            computes step ``k + 1``. A row that step ``k`` ended with a stop token or string is decoded once more and
            that token dropped. Same tokens, log-probs and finish reasons as without (greedy, or ``keyed_draws``; the
            run's generator in row order draws for a different batch). Steps that admit prompts, preempt, or end a
            row by length wait for the step in flight first. ``None``: on where the decode step runs on CUDA (the
            Triton kernels), off elsewhere (on CPU every op has finished when it returns: nothing to overlap, and
            the extra row-step would only cost).
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
        self.decoder = LlamaFamilyDecoder(model)
        if own_model:
            self.decoder.release_module_projections()
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunked_prefill = enable_chunked_prefill
        check_token_budget(self.token_budget, max_num_seqs=max_num_seqs, chunked=enable_chunked_prefill)
        self.cache: PagedKVCache | None = None
        self.allocator: BlockAllocator | None = None
        self.mirror: SlotMirror | None = None
        self.prefix_cache_tokens = prefix_cache_tokens
        self.num_kv_blocks = num_kv_blocks
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
        self.capture_sizes = cudagraph_capture_sizes
        self.gpu_memory_utilization = gpu_memory_utilization
        self.runner = ModelRunner(self.decoder, lanes=self.lanes, enforce_eager=self.enforce_eager,
                                  capture_sizes=cudagraph_capture_sizes)
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
        """Forget every named block (vLLM's ``reset_prefix_cache``): a prompt then prefills all its tokens. A
        prefill that starts from cached blocks sums in another order than a whole one (other matmul shapes), so
        a rollout batch is bitwise the same whatever ran before it only when it starts with no names: the
        rollout worker calls this at the start of every batch (a resumed run never saw the validation rollout
        whose turns the uninterrupted run would otherwise reuse at the next step)."""
        self.encoded_images.clear()  # the tower's outputs too: a batch's images are encoded as they were first
        if self.allocator is not None:
            self.allocator.drop_names()

    def release_kv_cache(self) -> bool:
        """Give the KV cache's memory back while nothing generates (verl's ``rollout.free_cache_engine``: the hybrid
        engine's rollout frees it during the actor's update and has it again at the next rollout); returns whether
        it is released (also when nothing was held), ``False`` when a run holds it.

        Dropped: the block pool (the prefix cache's named blocks with it), the CPU slot mirror and the CUDA graphs
        (they hold the pool's addresses, and their own memory pool); the memory goes back to the OS
        (:func:`~hybridflow.cpu.return_freed_memory`; the pool and mirror are memory maps, unmapped when freed) or
        to the device (``torch.cuda.empty_cache``). Weights, the rotary table and compiled kernels stay. The next
        ``generate`` or request queue allocates them as the first one did: :meth:`_reserve` sizes the pool for its
        own batch within ``gpu_memory_utilization`` of what is free then (so the pool a step gets can differ from
        the first one's when the budget binds: the optimizer's state exists by then), and on CUDA each batch
        bucket's graph is captured again the first time that bucket runs (:meth:`_graphs_for`).

        The cost on CUDA, not measured yet (no GPU in the session that wrote this): allocating and zeroing the pool
        (a memset, well under a decode step per GB) and, per bucket the rollout reaches, one eager warm-up step
        plus one capture (the Triton kernels are compiled once per process, not again): a few decode steps' time
        for each of at most ``len(cudagraph_capture_sizes)`` buckets, against a rollout of ``response_length``
        steps. Accepted because the pool is the memory that matters (the 1.5B shape's 256 rows x 1,536 positions
        take 11.3 GB in bf16, the update's activations and optimizer state need it), and keeping the graphs valid
        would need the pool at the same device addresses after it was given back, which takes the CUDA driver's
        virtual memory calls (map and unmap physical pages under a reserved address range; vLLM's sleep mode does
        this with its own allocator); with ``free_cache_engine=False`` nothing is released and the graphs live on.

        Refused, nothing freed, while a run is open (:attr:`open_runs`: a streaming session or a request queue not
        closed yet; their runs hold the pool and go on using it): close it first.
        """
        if len(self.open_runs):
            return False
        self.cache = self.allocator = self.mirror = self.graphs = None
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
        """Bytes allocated for the KV cache now: the block pool and, on CPU, the slot mirror (on CPU only the pages
        written are resident: :func:`~hybridflow.rollout.kv_cache.zeros_on_first_touch`)."""
        held = [self.cache.data] if self.cache is not None else []
        if self.mirror is not None:
            held.append(self.mirror.data)
        return sum(tensor.numel() * tensor.element_size() for tensor in held)

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
        cache = self._reserve(sequences=rows, max_len=max_len)
        self.decoder.rope_table(cache.max_len)  # once, rather than growing it step by step
        run = GenerationRun(cache=cache, allocator=self.allocator, generator=self._generator(seed),
                            tokenizer=self.tokenizer, waiting=deque(), max_num_seqs=rows,
                            vocab_size=self.decoder.vocab_size,
                            tables=HostBlockTables(rows=rows, width=cache.table_width),
                            mirror=self._mirror_for(cache, rows), clock=self.step_clock)
        self._note_kv_bytes()
        self.open_runs.add(run)  # until its queue closes (close_run)
        return run

    def _mirror_for(self, cache: PagedKVCache, rows: int) -> SlotMirror | None:
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

    def _generator(self, seed: int | None) -> torch.Generator:
        generator = torch.Generator(device=self.device)
        seed = int(torch.randint(2**62, (1,)).item()) if seed is None else seed
        return generator.manual_seed(seed)

    def _reserve(self, *, sequences: int, max_len: int) -> PagedKVCache:
        """The block pool, grown when it holds fewer blocks than ``sequences`` sequences of ``max_len`` take (at
        most what ``gpu_memory_utilization`` leaves room for: the rest wait, and preemption keeps the running ones
        within the pool). It never shrinks, and growing it keeps the named blocks (a conversation's next, longer
        turn still finds its earlier turns)."""
        dtype = self.decoder.embed.dtype
        max_len = self._cache_row_length(max_len)
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
        self.cache = self.graphs = self.allocator = None  # free the old ones before allocating
        self.cache = PagedKVCache(
            layers=self.decoder.num_layers, blocks=blocks, block_size=BLOCK_SIZE, kv_heads=self.decoder.kv_heads,
            max_len=max_len, head_dim=self.decoder.head_dim, dtype=self.decoder.embed.dtype, device=self.device,
        )
        if kept is not None:
            self.cache.data[:, :, :, named] = kept
        self.allocator = allocator

    def _cache_row_length(self, max_len: int) -> int:
        """Positions a block table spans: with the Triton kernels, a multiple of their span rounding (fewer caches,
        so fewer graph captures and kernel compiles)."""
        if not self.triton_kernels:
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
        per_block = (self.decoder.num_layers * 2 * self.decoder.kv_heads * self.decoder.head_dim * BLOCK_SIZE
                     * self.decoder.embed.element_size())
        return kv_blocks_within(budget=self.gpu_memory_utilization * total - max(in_use - own, 0), per_block=per_block,
                                utilization=self.gpu_memory_utilization, total=total, max_len=max_len)

    def _graphs_for(self, cache: PagedKVCache) -> DecodeGraphs:
        return self.runner.graphs_for(cache, rows=self.max_num_seqs)

    def capture(self) -> None:
        """Allocate the KV cache at full size (``max_num_seqs`` x ``max_model_len``) and capture the CUDA graph
        of every batch bucket now, as vLLM does at start-up, rather than lazily in the first steps that need
        them. Nothing to do on CPU or with ``enforce_eager``."""
        if self.enforce_eager:
            return
        cache = self._reserve(sequences=self.max_num_seqs, max_len=self.max_model_len)
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
        """Prefill waiting prompts and move their samples into the batch; a prompt is prefilled once for all its
        samples.

        With chunked prefill this is the prefill half of one engine step: it spends what the step's token budget
        leaves after one decode token per live row (:meth:`_prefill_admissible`), and a prompt it could not finish
        goes on at the next step. Admission goes in waves: every waiting sample that fits (a free row and a free
        block each) joins, and the first tokens of the whole wave are sampled in one call (one host sync, not one
        per prompt); samples that stop at their first token make room for the next wave."""
        run.step_prefill = run.step_decode = 0
        if run.waiting:  # who joins depends on who ended: the step in flight lands first (as without overlap)
            run.land_in_flight()
        while run.waiting and len(run.live) < run.max_num_seqs:
            if not run.waiting[0].ready:  # also when samples that stopped at once freed more room
                # What the step has left: its budget less a decode token a row (those that joined so far included).
                allowance = self.token_budget - len(run.live) - run.step_prefill if self.chunked_prefill else math.inf
                if allowance <= 0:
                    return  # the step's budget is spent: the head's next chunk comes at the next step
                self._prefill_admissible(run, allowance)
            wave = admission_wave(run)
            if not wave:
                if run.live or run.waiting[0].blocks is not None:
                    return  # the head waits for blocks running sequences free, or for its next chunk
                if not run.drop_waiting_prefill():
                    raise RolloutError(f"no KV block is left for a prompt of {len(run.waiting[0].token_ids)} tokens "
                                       "with nothing running: raise num_kv_blocks or gpu_memory_utilization")
                continue
            self._join(run, wave)

    def _join(self, run: GenerationRun, wave: list[tuple[PendingPrompt, int]]) -> None:
        """Sample the first token of every sample in ``wave`` from its prompt's last logits and add it to the batch."""
        tokens, logprobs = self.runner.sample_first_tokens(run, wave)
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

    def _prefill_admissible(self, run: GenerationRun, allowance: float) -> None:
        """Plan the prefill of the prompts that get a row now (:func:`~hybridflow.rollout.scheduler.plan_prefill`),
        run it, and let copies of a prompt share its prefill."""
        plan = plan_prefill(run, allowance)
        self.runner.prefill(run, plan.chunks, token_budget=self.token_budget)
        share_prefills(plan)

    def _step(self, run: GenerationRun) -> None:
        """One decode step over every live sequence (in lanes on CPU when there are enough of them).

        With :attr:`overlap_steps`, the step is launched before the host reads the previous one's tokens (its
        inputs taken on the device from that step's samples) and is left in flight; the host then reads the previous
        step back and does its bookkeeping while this one runs. The previous step lands first instead (exact host
        records, a synchronous step) when too few blocks are free for every row's next write (it may preempt). A row
        that the step in flight ends by length is decoded as padding (:meth:`GenerationRun.ended_ahead`); a step
        whose every row ends lands at once (nothing could follow it)."""
        previous = run.in_flight
        if previous is not None and not blocks_for_next_writes(run):
            run.land_in_flight()
            previous = None
        run.make_writable()  # no preemption with a step in flight: checked above
        launched = self.runner.launch(run, self.cache, rows=self.max_num_seqs) if not all(run.ended_ahead(s) for s in run.live) else None
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

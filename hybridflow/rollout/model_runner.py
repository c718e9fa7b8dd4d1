"""The native engine's model runner: it executes what the scheduler planned (nano-vllm's ``model_runner``).

Prefill passes over planned chunks, first-token sampling of an admission wave, and the decode step of every live
row: replayed from a CUDA graph (:mod:`hybridflow.rollout.cuda_graphs`), run eagerly, or on CPU split into
concurrent lanes (:mod:`hybridflow.rollout.lanes`); sampling runs on the device (:mod:`hybridflow.rollout.sampler`).
It keeps no state of a run: the run's records stay in the :class:`GenerationRun` it is handed.
"""

from __future__ import annotations

import torch

from hybridflow.rollout.cuda_graphs import DecodeGraphs
from hybridflow.rollout.decoder import LlamaFamilyDecoder
from hybridflow.rollout.generation_run import GenerationRun, InFlightStep, PendingPrompt
from hybridflow.rollout.kv_cache import MirroredCache, PagedKVCache
from hybridflow.rollout.lanes import DecodeLanes
from hybridflow.rollout.sampler import RowSampling, sample_tokens, seen_mask
from hybridflow.rollout.scheduler import Chunk, prefill_passes


class ModelRunner:
    """Runs the decoder over a run's planned chunks and live rows.

    Args:
        decoder: the engine's decoder (its weights, prefill and decode).
        lanes: on CPU, the concurrent slices a wide decode step is split into; ``None``: one call.
        enforce_eager: with the Triton kernels, run every decode step eagerly instead of replaying CUDA graphs.
        capture_sizes: the CUDA graph batch sizes (``None``: :data:`~hybridflow.rollout.cuda_graphs.CAPTURE_SIZES`).
    """

    def __init__(self, decoder: LlamaFamilyDecoder, *, lanes: DecodeLanes | None, enforce_eager: bool,
                 capture_sizes: list[int] | None):
        self.decoder = decoder
        self.lanes = lanes
        self.enforce_eager = enforce_eager
        self.capture_sizes = capture_sizes
        self.graphs: DecodeGraphs | None = None

    @property
    def device(self) -> torch.device:
        return self.decoder.embed.device

    def prefill(self, run: GenerationRun, chunks: list[Chunk], *, token_budget: int) -> None:
        """Compute each chunk in packed passes (:func:`~hybridflow.rollout.scheduler.prefill_passes`)."""
        for batch in prefill_passes(chunks, token_budget=token_budget, varlen=self.decoder.varlen_prefill):
            self._prefill_pass(run, batch)

    def _prefill_pass(self, run: GenerationRun, batch: list[Chunk]) -> None:
        """One packed pass over positions ``start .. end - 1`` of each prompt, each attending to its first ``start``
        positions through its blocks (a cached prefix or earlier chunks): store the new keys and values, name the
        full blocks for later reuse, and keep a finished prompt's last logits."""
        cache = run.cache
        prompts = [torch.tensor(p.token_ids[start:end], dtype=torch.long, device=self.device)
                   for p, start, end in batch]
        computed = [cache.prefix(p.blocks.blocks, start) if start else None for p, start, _ in batch]
        images = [None if p.images is None else p.images.chunk(start, end) for p, start, end in batch]
        vision = {"images": images} if any(image is not None for image in images) else {}
        for (pending, start, end), (logits, kv) in zip(batch, self.decoder.prefill_many(prompts, computed=computed,
                                                                                        **vision)):
            cache.write_prompt(pending.blocks.blocks, kv, start=start)
            pending.blocks.name_full_blocks(pending.key_ids, end)
            pending.prefilled = end
            if end == len(pending.token_ids):
                pending.first_logits = logits
        run.step_prefill += sum(end - start for _, start, end in batch)
        run.peak_step_tokens = max(run.peak_step_tokens, run.step_prefill)

    def sample_first_tokens(self, run: GenerationRun,
                            wave: list[tuple[PendingPrompt, int]]) -> tuple[list[int], list[float]]:
        """The first token (and its log-prob) of every sample in ``wave``, from its prompt's last logits, in one
        sampling call."""
        vocab = self.decoder.vocab_size
        rows = RowSampling.of([pending.params for pending, count in wave for _ in range(count)],
                              vocab_size=vocab, device=self.device)
        logits = torch.cat([pending.first_logits[None].expand(count, -1) for pending, count in wave])
        uniform = None if rows.all_greedy else run.wave_uniform(wave, device=self.device)
        seen = seen_mask([pending.token_ids for pending, count in wave for _ in range(count)],
                         vocab_size=vocab, device=self.device) if rows.needs_repetition_penalty else None
        tokens, logprobs = sample_tokens(logits=logits, params=rows, uniform=uniform, seen=seen)
        return tokens.tolist(), logprobs.tolist()

    def launch(self, run: GenerationRun, cache: PagedKVCache, *, rows: int) -> InFlightStep:
        """Launch the decode step of the live rows (their next writes made room for) over ``cache`` and start
        reading it back; ``rows`` sizes the CUDA graphs (the engine's ``max_num_seqs``)."""
        count = len(run.live)
        run.step_decode = count
        run.peak_step_tokens = max(run.peak_step_tokens, run.step_prefill + count)
        sampling = run.row_sampling(vocab_size=self.decoder.vocab_size, device=self.device)
        # Drawn here for the whole batch, so the draws do not depend on how it is split.
        uniform = None if sampling.all_greedy else run.step_uniform(device=self.device)
        positions = run.step_positions()
        inputs = run.step_inputs(positions, device=self.device)
        # Only a vision-language model's rows can rotate elsewhere: a text model's step never looks.
        rope_positions = run.rope_positions(positions, device=self.device) if self.decoder.vision_language else None

        def decode_rows(start: int, stop: int):
            return self._decode_rows(run, cache, (*inputs, rope_positions), positions, start, stop, sampling, uniform,
                                     rows=rows)

        if self.lanes is None:
            tokens, logprobs = decode_rows(0, count)
        else:
            tokens, logprobs = (torch.cat(columns) for columns in zip(*self.lanes.run(decode_rows, count)))
        return run.launched(tokens, logprobs)

    def _decode_rows(self, run: GenerationRun, cache: PagedKVCache,
                     inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None],
                     positions: list[int], start: int, stop: int, sampling: RowSampling, uniform: torch.Tensor | None,
                     *, rows: int):
        """Decode and sample live rows ``start .. stop - 1``; returns ``(tokens, logprobs)``."""
        token_ids, position_ids, block_tables, rope_positions = (
            None if tensor is None else tensor[start:stop] for tensor in inputs)
        rows_cache = cache if run.mirror is None else MirroredCache(cache, run.mirror, start)
        logits = self.decode(token_ids=token_ids, positions=position_ids, block_tables=block_tables,
                             context=max(positions[start:stop]) + 1, cache=rows_cache, pool=cache,
                             rope_positions=rope_positions, rows=rows)
        seen = run.seen.rows([s.row for s in run.live[start:stop]]) if sampling.needs_repetition_penalty else None
        return sample_tokens(logits=logits, params=sampling.slice(start, stop),
                             uniform=None if uniform is None else uniform[start:stop], seen=seen)

    def decode(self, *, token_ids: torch.Tensor, positions: torch.Tensor, block_tables: torch.Tensor,
               context: int, cache: PagedKVCache | MirroredCache, pool: PagedKVCache, rows: int,
               rope_positions: torch.Tensor | None = None) -> torch.Tensor:
        """``[N, V]`` logits of one decode step: replayed from a CUDA graph over ``pool``, or run eagerly."""
        if not self.decoder.triton_kernels:
            return self.decoder.decode(token_ids=token_ids, positions=positions, cache=cache,
                                       block_tables=block_tables, context=context, rope_positions=rope_positions)
        if self.enforce_eager:
            return self.decoder.decode(token_ids=token_ids, positions=positions, cache=pool,
                                       block_tables=block_tables, rope_positions=rope_positions)
        return self.graphs_for(pool, rows=rows)(token_ids=token_ids, positions=positions, block_tables=block_tables,
                                                rope_positions=rope_positions)

    def drop_graphs(self) -> None:
        """Forget the CUDA graphs (they read the old pool's addresses: the pool is about to be replaced)."""
        self.graphs = None

    def graphs_for(self, cache: PagedKVCache, *, rows: int) -> DecodeGraphs:
        """The CUDA graphs over ``cache`` for up to ``rows`` rows (captured again when the pool or weights changed)."""
        if self.graphs is None or not self.graphs.valid_for(cache) or self.graphs.rows < rows:
            self.graphs = DecodeGraphs(self.decoder, cache, rows=rows, capture_sizes=self.capture_sizes)
        return self.graphs

"""Decode steps replayed from CUDA graphs: one graph per batch-size bucket.

An eager decode step launches hundreds of small kernels from Python (about 35 a layer in torch
ops, ten with the fused Triton kernels); at a few microseconds of launch cost each, a step of a
small model is bound by the launches, not by the GPU (65 ms a step for SmolLM2-135M at batch 64
on an H100, measured before this module; 2.2 ms on an H200 with graphs and the fused kernels). A
CUDA graph records the step's kernels once and replays them with one launch. That needs a step
with static shapes and no host-side decisions, which :meth:`LlamaFamilyDecoder.decode` is when
``context=None`` (the Triton kernels read each row's length on the device):

- the inputs live in static buffers (``tokens``, ``positions``, and the block tables ``[rows, W]``
  with ``W`` the cache's table width); a step over ``N`` rows copies its values into them and replays
  the graph of the smallest bucket ``B >= N``;
- rows ``N .. B - 1`` are padding: position 0 and a table of null blocks
  (:data:`~hybridflow.rollout.block_manager.NULL_BLOCK`), so what they write lands in the one block no
  sequence reads;
- graphs are captured lazily, the first time a bucket is needed, and all share one memory pool.

Graphs hold raw pointers to the cache, the rotary table and the weights. A weight sync copies the
new weights into the same tensors (:meth:`PackedLinear.assign`), so the graphs stay valid across
training steps; whenever a tensor is replaced instead, :meth:`DecodeGraphs.valid_for` says so and
the engine captures new ones.
"""

from __future__ import annotations

import torch

CAPTURE_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)
"""Default batch buckets (vLLM / nano-vllm capture a similar ladder); larger engines add steps of 64."""


def bucket_sizes(max_rows: int, sizes: tuple[int, ...] | list[int] | None = None) -> list[int]:
    """The capture sizes up to ``max_rows``, always ending with ``max_rows`` itself."""
    ladder = list(sizes or CAPTURE_SIZES)
    if sizes is None:
        ladder += list(range(320, max_rows + 1, 64))
    return sorted({s for s in ladder if s < max_rows} | {max_rows})


class DecodeGraphs:
    """Replays :meth:`LlamaFamilyDecoder.decode` over up to ``rows`` sequences of one cache from CUDA graphs."""

    def __init__(self, decoder, cache, *, rows: int, capture_sizes: list[int] | None = None):
        self.decoder = decoder
        self.cache = cache
        self.rows = rows
        self.buckets = bucket_sizes(rows, capture_sizes)
        device = decoder.embed.device
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)
        # A vision-language model's rows rotate at position + delta: one more static input (text models: none).
        self.rope_positions = torch.zeros(rows, dtype=torch.long, device=device) if decoder.vision_language else None
        self.block_tables = torch.zeros(rows, cache.table_width, dtype=torch.int32, device=device)
        self.rope = decoder._rope  # the rotary table the graphs read
        self.weights_epoch = decoder.weights_epoch  # the weight tensors they read
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.pool = None

    def valid_for(self, cache) -> bool:
        """Whether these graphs still point at ``cache`` (with the table width they were captured for), the
        decoder's rotary table and its weight tensors (a weight sync copies in place on CUDA, so graphs survive it)."""
        return (cache is self.cache and cache.table_width == self.block_tables.shape[1]
                and self.decoder._rope is self.rope
                and self.decoder.weights_epoch == self.weights_epoch)

    def __call__(self, *, token_ids: torch.Tensor, positions: torch.Tensor, block_tables: torch.Tensor,
                 rope_positions: torch.Tensor | None = None) -> torch.Tensor:
        """``[N, V]`` logits of one decode step over ``N`` sequences (``block_tables`` ``[N, <= W]``;
        ``rope_positions`` ``[N]``: a vision-language model's rotations, ``None`` = ``positions``)."""
        count, width = block_tables.shape
        bucket = next(b for b in self.buckets if b >= count)
        self.tokens[:count].copy_(token_ids)
        self.positions[:count].copy_(positions)
        self.positions[count:bucket].zero_()  # padding rows: position 0 of the null block
        if self.rope_positions is not None:
            self.rope_positions[:count].copy_(positions if rope_positions is None else rope_positions)
            self.rope_positions[count:bucket].zero_()
        self.block_tables[:count, :width].copy_(block_tables)
        self.block_tables[:count, width:].zero_()
        self.block_tables[count:bucket].zero_()
        graph = self.graphs.get(bucket) or self._capture(bucket)
        graph.replay()
        return self.logits[bucket][:count]

    def _step(self, bucket: int) -> torch.Tensor:
        rope = None if self.rope_positions is None else self.rope_positions[:bucket]
        return self.decoder.decode(token_ids=self.tokens[:bucket], positions=self.positions[:bucket],
                                   cache=self.cache, block_tables=self.block_tables[:bucket], context=None,
                                   rope_positions=rope)

    def _capture(self, bucket: int) -> torch.cuda.CUDAGraph:
        # One eager run on a side stream first (Triton compiles, cuBLAS picks kernels); it writes where the
        # replay will write (the rows' own blocks, the null block for padding), so no other sequence's keys.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._step(bucket)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.logits[bucket] = self._step(bucket)
        self.pool = graph.pool()
        self.graphs[bucket] = graph
        return graph

    def capture_all(self) -> None:
        """Capture every bucket now, largest first (smaller graphs then reuse its pool's memory); the capture
        runs write into the null block only."""
        self.positions.zero_()
        if self.rope_positions is not None:
            self.rope_positions.zero_()
        self.block_tables.zero_()
        for bucket in sorted(self.buckets, reverse=True):
            if bucket not in self.graphs:
                self._capture(bucket)

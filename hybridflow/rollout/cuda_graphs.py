"""Decode steps replayed from CUDA graphs: one graph per batch-size bucket.

An eager decode step launches hundreds of small kernels from Python (about 35 a layer in torch
ops, ten with the fused Triton kernels); at a few microseconds of launch cost each, a step of a
small model is bound by the launches, not by the GPU (65 ms a step for SmolLM2-135M at batch 64
on an H100, measured before this module; 2.2 ms on an H200 with graphs and the fused kernels). A
CUDA graph records the step's kernels once and replays them with one launch. That needs a step
with static shapes and no host-side decisions, which :meth:`LlamaFamilyDecoder.decode` is when
``context=None`` (the Triton kernels read each row's length on the device):

- the inputs live in static buffers (``tokens``, ``positions``); a step over ``N`` rows copies
  its values into them and replays the graph of the smallest bucket ``B >= N``;
- rows ``N .. B - 1`` decode whatever the buffers hold, in slots no live sequence uses (live
  sequences occupy slots ``0 .. N - 1``); what they write there is overwritten before any
  sequence reads it (:meth:`SlotKVCache.fill` writes a new sequence's prompt first);
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
    """Replays :meth:`LlamaFamilyDecoder.decode` over slots ``0 .. N - 1`` of one cache from CUDA graphs."""

    def __init__(self, decoder, cache, *, capture_sizes: list[int] | None = None):
        self.decoder = decoder
        self.cache = cache
        self.buckets = bucket_sizes(cache.slots, capture_sizes)
        device = decoder.embed.device
        self.tokens = torch.zeros(cache.slots, dtype=torch.long, device=device)
        self.positions = torch.zeros(cache.slots, dtype=torch.long, device=device)
        self.rope = decoder._rope  # the rotary table the graphs read
        self.weights_epoch = decoder.weights_epoch  # the weight tensors they read
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.pool = None

    def valid_for(self, cache) -> bool:
        """Whether these graphs still point at ``cache``, the decoder's rotary table and its weight tensors
        (a weight sync copies in place on CUDA, so graphs survive it)."""
        return (cache is self.cache and self.decoder._rope is self.rope
                and self.decoder.weights_epoch == self.weights_epoch)

    def __call__(self, *, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``[N, V]`` logits of one decode step over slots ``0 .. N - 1``."""
        count = token_ids.shape[0]
        bucket = next(b for b in self.buckets if b >= count)
        self.tokens[:count].copy_(token_ids)
        self.positions[:count].copy_(positions)
        self.positions[count:bucket].zero_()  # padding rows: position 0 of free slots
        graph = self.graphs.get(bucket) or self._capture(bucket)
        graph.replay()
        return self.logits[bucket][:count]

    def _step(self, bucket: int) -> torch.Tensor:
        return self.decoder.decode(token_ids=self.tokens[:bucket], positions=self.positions[:bucket],
                                   cache=self.cache, context=None)

    def _capture(self, bucket: int) -> torch.cuda.CUDAGraph:
        # One eager run on a side stream first (Triton compiles, cuBLAS picks kernels); it writes the
        # same keys and values the replay will write, so it changes nothing a sequence reads.
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
        """Capture every bucket now, largest first (smaller graphs then reuse its pool's memory). Only
        while no sequence is live: the capture runs write position 0 of every slot."""
        self.positions.zero_()
        for bucket in sorted(self.buckets, reverse=True):
            if bucket not in self.graphs:
                self._capture(bucket)

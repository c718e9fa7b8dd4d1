"""From one global SFT batch to this rank's micro-batches of model inputs.

Every rank draws the same global batch of ``train_batch_size`` samples from the
stateful loader (same seed, same position), keeps its contiguous slice of
``train_batch_size / world_size`` samples and cuts it into micro-batches of
``micro_batch_size_per_gpu``. Because every rank sees the whole global batch, the
token count that normalises the loss is computed locally, with no communication.

A micro-batch becomes model inputs in one of two layouts:

* padded: ``collate_sft`` -> ``[B, T]`` with a 2-D attention mask;
* packed (``data.use_packing``): one row ``[1, N]`` with no padding, position ids
  restarting at 0 for each sample, and attention kept inside each sample: segment
  attention (:mod:`hybridflow.models.segment_attention`, one causal SDPA call per
  sample), or position ids alone for flash-attention's varlen kernels (transformers
  derives the boundaries from them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hybridflow.data.packing import pack_sequences
from hybridflow.data.sft_dataset import collate_sft
from hybridflow.models.segment_attention import SegmentLayout, packed_row_mask

Sample = dict[str, torch.Tensor]


def rank_slice(samples: Sequence[Sample], *, rank: int, world_size: int) -> list[Sample]:
    """The contiguous ``len(samples) / world_size`` samples of ``rank`` (the length divides evenly)."""
    per_rank = len(samples) // world_size
    return list(samples[rank * per_rank : (rank + 1) * per_rank])


def split_micro(samples: Sequence[Sample], *, micro_batch_size: int) -> list[list[Sample]]:
    """Consecutive groups of ``micro_batch_size`` samples (the last may be shorter)."""
    return [list(samples[i : i + micro_batch_size]) for i in range(0, len(samples), micro_batch_size)]


def count_targets(samples: Sequence[Sample]) -> int:
    """Target tokens of ``samples``: the ``N`` of the token-mean loss."""
    return int(sum(int(sample["loss_mask"].sum()) for sample in samples))


def padded_inputs(samples: Sequence[Sample], *, pad_token_id: int) -> dict[str, torch.Tensor]:
    """``input_ids, attention_mask, position_ids, loss_mask``, all ``[B, T]``, right-padded."""
    return collate_sft(samples, pad_token_id=pad_token_id)


def packed_inputs(samples: Sequence[Sample], *, attn_implementation: str) -> dict[str, Any]:
    """All ``samples`` in one row: ``input_ids, position_ids, loss_mask`` ``[1, N]``, and how attention
    is kept inside each sample: for flash-attention's varlen kernels no mask (transformers finds the
    boundaries from ``position_ids``); for every other implementation a ``segment_layout`` for
    segment attention (one causal SDPA call per sample, no ``[N, N]`` mask) and a placeholder mask."""
    budget = sum(sample["input_ids"].numel() for sample in samples)
    pack = pack_sequences(samples, max_tokens=budget)[0]
    inputs: dict[str, Any] = {key: pack[key] for key in ("input_ids", "position_ids", "loss_mask")}
    if attn_implementation.startswith("flash_attention"):
        inputs["attention_mask"] = None
        return inputs
    cu = pack["cu_seqlens"].tolist()
    inputs["attention_mask"] = packed_row_mask()
    inputs["segment_layout"] = SegmentLayout(bounds=list(zip(cu[:-1], cu[1:])), masks=[None] * (len(cu) - 1))
    return inputs


def micro_batch_inputs(samples: Sequence[Sample], *, use_packing: bool, pad_token_id: int,
                       attn_implementation: str) -> dict[str, Any]:
    """Model inputs of one micro-batch in the configured layout."""
    if use_packing:
        return packed_inputs(samples, attn_implementation=attn_implementation)
    return padded_inputs(samples, pad_token_id=pad_token_id)


def even_shard(samples: Sequence[Sample], *, rank: int, world_size: int, micro_batch_size: int) -> list[list[Sample]]:
    """Validation micro-batches of ``rank`` (samples ``rank::world_size``), equally many on every rank.

    FSDP needs every rank to run the same number of forwards, so a rank with fewer
    micro-batches gets fillers: copies of a sample with an all-zero loss mask.
    """
    mine = split_micro(list(samples[rank::world_size]), micro_batch_size=micro_batch_size)
    longest_shard = -(-len(samples) // world_size)
    needed = -(-longest_shard // micro_batch_size)
    filler = {**samples[0], "loss_mask": torch.zeros_like(samples[0]["loss_mask"])}  # images, if any, go along
    return mine + [[filler]] * (needed - len(mine))

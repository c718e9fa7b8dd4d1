"""sft_batches: rank slices, micro-batches, validation shards, and packed rows equal to padded ones."""

import pytest
import torch

from hybridflow.models.segment_attention import use_segment_attention
from hybridflow.models.tiny import build_tiny_model
from hybridflow.trainer.sft.batches import (
    count_targets,
    even_shard,
    packed_inputs,
    padded_inputs,
    rank_slice,
    split_micro,
)


def _sample(length, first_id=3):
    ids = torch.arange(first_id, first_id + length)
    mask = torch.ones(length, dtype=torch.long)
    mask[:2] = 0  # a 2-token "prompt"
    return {"input_ids": ids, "loss_mask": mask}


def test_rank_slice_and_micro_batches():
    samples = [_sample(3 + i) for i in range(8)]
    assert rank_slice(samples, rank=1, world_size=2) == samples[4:]
    micro = split_micro(samples[:5], micro_batch_size=2)
    assert [len(m) for m in micro] == [2, 2, 1]
    assert count_targets(samples) == sum(3 + i - 2 for i in range(8))


def test_even_shard_pads_the_short_rank_with_zero_loss_fillers():
    samples = [_sample(4 + i) for i in range(5)]
    rank0 = even_shard(samples, rank=0, world_size=2, micro_batch_size=2)  # samples 0, 2, 4
    rank1 = even_shard(samples, rank=1, world_size=2, micro_batch_size=2)  # samples 1, 3 + a filler
    assert len(rank0) == len(rank1) == 2
    assert [s["input_ids"].numel() for s in rank0[0] + rank0[1]] == [4, 6, 8]
    assert rank1[1][0]["loss_mask"].sum() == 0
    assert count_targets([s for micro in rank0 + rank1 for s in micro]) == count_targets(samples)


def test_packed_row_keeps_attention_inside_each_sample():
    samples = [_sample(2), _sample(3)]
    packed = packed_inputs(samples, attn_implementation="sdpa")
    assert packed["position_ids"].tolist() == [[0, 1, 0, 1, 2]]
    assert packed["segment_layout"].bounds == [(0, 2), (2, 5)]
    assert packed["segment_layout"].masks == [None, None]  # causal within each sample
    assert packed["attention_mask"].shape == (1, 1, 1, 1)  # a placeholder: no [N, N] mask is built
    flash = packed_inputs(samples, attn_implementation="flash_attention_2")
    assert flash["attention_mask"] is None and "segment_layout" not in flash


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_row_gives_the_padded_logits(attn):
    model, _ = build_tiny_model("llama", seed=0)
    model.set_attn_implementation(attn)
    samples = [_sample(5, first_id=10), _sample(9, first_id=40), _sample(3, first_id=90)]
    padded = padded_inputs(samples, pad_token_id=0)
    with torch.no_grad():
        padded_logits = model(**{k: padded[k] for k in ("input_ids", "attention_mask", "position_ids")}).logits
        packed = packed_inputs(samples, attn_implementation=attn)
        use_segment_attention(model)
        packed_logits = model(**{k: packed[k] for k in ("input_ids", "attention_mask", "position_ids",
                                                          "segment_layout")}).logits
    real = padded["attention_mask"].bool()
    torch.testing.assert_close(packed_logits[0], padded_logits[real], rtol=1e-5, atol=1e-5)
    assert torch.equal(packed["loss_mask"][0], padded["loss_mask"][real])

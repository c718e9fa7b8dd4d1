"""Batch: alignment of tensor and non-tensor columns through every row operation."""

import numpy as np
import pytest
import torch

from hybridflow.data.batch import Batch


def make_batch(size: int = 4) -> Batch:
    """Row i holds the value i everywhere, so the row order is readable from any column."""
    rows = torch.arange(size)
    return Batch.from_dict(
        tensors={
            "input_ids": rows[:, None] * 10 + torch.arange(3),  # [B, L=3]
            "response_mask": torch.ones(size, 2, dtype=torch.bool),  # [B, T=2]
        },
        non_tensors={
            "uid": [f"u{i}" for i in range(size)],
            "reward_model": [{"ground_truth": str(i)} for i in range(size)],
        },
    )


def row_ids(batch: Batch) -> list[int]:
    return (batch["input_ids"][:, 0] // 10).tolist()


def test_columns_and_len():
    batch = make_batch(4)
    assert len(batch) == 4
    assert batch["input_ids"].shape == (4, 3)
    assert batch["uid"].tolist() == ["u0", "u1", "u2", "u3"]
    assert batch["uid"].dtype == object and batch["uid"].shape == (4,)
    assert "uid" in batch and "nope" not in batch


def test_list_of_equal_length_lists_stays_one_dimensional():
    batch = Batch.from_dict(non_tensors={"raw_prompt": [[{"role": "user"}], [{"role": "user"}]]})
    assert batch["raw_prompt"].shape == (2,)
    assert batch["raw_prompt"][1] == [{"role": "user"}]


def test_length_mismatch_rejected_on_construction_and_set():
    with pytest.raises(ValueError, match="same leading dimension"):
        Batch.from_dict(tensors={"a": torch.zeros(3, 2)}, non_tensors={"uid": ["x", "y"]})
    batch = make_batch(4)
    with pytest.raises(ValueError, match="has 5 rows but the batch has 4"):
        batch["values"] = torch.zeros(5, 2)
    with pytest.raises(TypeError, match="pass scalars as arguments"):
        batch["scalar"] = np.array(1.0)
    batch["values"] = torch.zeros(4, 2)  # right length is accepted
    assert batch["values"].shape == (4, 2)


def test_views_are_read_only_and_missing_key_names_columns():
    batch = make_batch(2)
    with pytest.raises(TypeError):
        batch.tensors["x"] = torch.zeros(2)  # type: ignore[index]
    with pytest.raises(KeyError, match="columns:.*input_ids"):
        batch["missing"]


def test_repeat_interleave_and_tile_order():
    batch = make_batch(3)
    interleaved = batch.repeat(2, interleave=True)
    assert row_ids(interleaved) == [0, 0, 1, 1, 2, 2]
    assert interleaved["uid"].tolist() == ["u0", "u0", "u1", "u1", "u2", "u2"]
    tiled = batch.repeat(2, interleave=False)
    assert row_ids(tiled) == [0, 1, 2, 0, 1, 2]
    assert tiled["uid"].tolist() == ["u0", "u1", "u2", "u0", "u1", "u2"]
    with pytest.raises(ValueError, match=">= 1"):
        batch.repeat(0)


def test_index_select_keeps_non_tensors_aligned():
    batch = make_batch(5)
    picked = batch.index_select([4, 0, 2])
    assert row_ids(picked) == [4, 0, 2]
    assert picked["uid"].tolist() == ["u4", "u0", "u2"]
    assert [r["ground_truth"] for r in picked["reward_model"]] == ["4", "0", "2"]
    masked = batch.index_select(torch.tensor([True, False, True, False, False]))
    assert masked["uid"].tolist() == ["u0", "u2"] and row_ids(masked) == [0, 2]
    with pytest.raises(IndexError):
        batch.index_select([5])


def test_split_concat_round_trip_and_uneven_last_piece():
    batch = make_batch(5)
    pieces = batch.split(2)
    assert [len(p) for p in pieces] == [2, 2, 1]
    joined = Batch.concat(pieces)
    assert torch.equal(joined["input_ids"], batch["input_ids"])
    assert joined["uid"].tolist() == batch["uid"].tolist()


def test_chunk_requires_divisible_and_split_by_sizes():
    batch = make_batch(6)
    assert [row_ids(c) for c in batch.chunk(3)] == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(ValueError, match="multiple of 4"):
        batch.chunk(4)
    pieces = batch.split_by_sizes([1, 3, 0, 2])
    assert [row_ids(p) for p in pieces] == [[0], [1, 2, 3], [], [4, 5]]
    assert [p["uid"].tolist() for p in pieces][1] == ["u1", "u2", "u3"]
    with pytest.raises(ValueError, match="sum to the batch size 6"):
        batch.split_by_sizes([3, 2])


def test_concat_rejects_mismatched_keys():
    a, b = make_batch(2), make_batch(2).select(["input_ids"])
    with pytest.raises(ValueError, match="batch 1 has keys"):
        Batch.concat([a, b])
    with pytest.raises(ValueError, match="at least one"):
        Batch.concat([])


def test_select_pop_union():
    batch = make_batch(3)
    only = batch.select(["input_ids", "uid"])
    assert sorted(only.keys()) == ["input_ids", "uid"] 
    popped = batch.pop(["response_mask"])
    assert popped.keys() == ["response_mask"] and "response_mask" not in batch
    merged = batch.union(popped)
    assert sorted(merged.keys()) == sorted(["input_ids", "response_mask", "uid", "reward_model"])
    same_again = merged.union(batch)  # overlapping keys with equal values are fine
    assert len(same_again) == 3
    conflicting = Batch.from_dict(tensors={"input_ids": torch.zeros(3, 3, dtype=torch.long)})
    with pytest.raises(ValueError, match="'input_ids' differs"):
        batch.union(conflicting)
    with pytest.raises(ValueError, match="3 and 2 samples"):
        batch.union(make_batch(2))


def test_to_device_and_repr():
    batch = make_batch(2).to("cpu")
    assert batch["input_ids"].device.type == "cpu"
    text = repr(batch)
    assert "B=2" in text and "input_ids: [2, 3] int64" in text and "uid: [2] object" in text


def test_setting_a_key_switches_its_kind():
    batch = make_batch(2)
    batch["uid"] = torch.tensor([7, 8])
    assert "uid" in batch.tensors and "uid" not in batch.non_tensors


def _rollout(prompts: list[list[int]], responses: list[list[int]], p: int, t: int) -> Batch:
    """Left-padded prompts, right-padded responses (pad 0), as the rollout worker builds them."""
    prompt_ids = torch.tensor([[0] * (p - len(x)) + x for x in prompts])
    response_ids = torch.tensor([y + [0] * (t - len(y)) for y in responses])
    prompt_mask = torch.tensor([[0] * (p - len(x)) + [1] * len(x) for x in prompts])
    response_mask = torch.tensor([[1] * len(y) + [0] * (t - len(y)) for y in responses])
    return Batch({"prompts": prompt_ids, "responses": response_ids, "response_mask": response_mask,
                  "input_ids": torch.cat([prompt_ids, response_ids], 1),
                  "attention_mask": torch.cat([prompt_mask, response_mask], 1),
                  "old_log_probs": response_mask * -0.5},
                 {"uid": [f"{len(x)}" for x in prompts]})


def test_concat_pads_rollouts_of_different_widths():
    """Two generate calls: widths (P, T) = (2, 3) and (3, 1); the result is (3, 3) with prompts padded on
    the left, responses on the right and input_ids / attention_mask on both sides of the prompt|response cut."""
    a = _rollout([[5, 6]], [[7, 8, 9]], p=2, t=3)
    b = _rollout([[1, 2, 3], [4]], [[9], [8]], p=3, t=1)
    both = Batch.concat([a, b])
    assert both["prompts"].tolist() == [[0, 5, 6], [1, 2, 3], [0, 0, 4]]
    assert both["responses"].tolist() == [[7, 8, 9], [9, 0, 0], [8, 0, 0]]
    assert both["input_ids"].tolist() == [[0, 5, 6, 7, 8, 9], [1, 2, 3, 9, 0, 0], [0, 0, 4, 8, 0, 0]]
    assert both["attention_mask"].tolist() == [[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 0, 0]]
    assert both["response_mask"].tolist() == [[1, 1, 1], [1, 0, 0], [1, 0, 0]]
    assert both["old_log_probs"].tolist() == [[-0.5] * 3, [-0.5, 0, 0], [-0.5, 0, 0]]
    assert list(both["uid"]) == ["2", "3", "1"]


def test_concat_names_a_column_it_cannot_align():
    a = _rollout([[5, 6]], [[7, 8, 9]], p=2, t=3)
    b = _rollout([[1, 2, 3]], [[9]], p=3, t=1)
    a["odd"], b["odd"] = torch.zeros(1, 7), torch.zeros(1, 7)
    with pytest.raises(ValueError, match="column 'odd' has width 7"):
        Batch.concat([a, b])

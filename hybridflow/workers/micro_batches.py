"""Splitting a worker's batch into optimizer mini-batches and forward micro-batches.

Losses are normalised by *global* counts (tokens or sequences of the whole mini-batch
across data-parallel ranks), so how a mini-batch is cut into micro-batches never
changes the gradient: the split below is free to optimise for memory and speed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from hybridflow.data.balance import balance_partitions, seqlen_workload
from hybridflow.data.batch import Batch


def split_by_token_budget(lengths: Sequence[int], max_tokens: int, *, padded: bool = True) -> list[list[int]]:
    """Group consecutive sequence indices so that each group's size fits ``max_tokens``.

    Size = group size x the longest sequence in it (what a padded forward costs), or with
    ``padded=False`` the sum of the lengths (what a packed row holds; verl's rule).
    A single sequence longer than the budget gets a group of its own.
    """
    groups: list[list[int]] = []
    current: list[int] = []
    longest = total = 0
    for i, length in enumerate(lengths):
        size = max(longest, length) * (len(current) + 1) if padded else total + length
        if current and size > max_tokens:
            groups.append(current)
            current, longest, total = [], 0, 0
        current.append(i)
        longest = max(longest, length)
        total += length
    if current:
        groups.append(current)
    return groups


def split_to_count(groups: list[list[int]], count: int) -> list[list[int]]:
    """Split the largest groups in two until there are ``count`` groups (each keeps >= 1 row).

    Under FSDP every rank must run the same number of forward/backward passes; token-budget
    grouping can give ranks different counts, so all ranks split up to the largest count.
    """
    groups = [list(g) for g in groups]
    while len(groups) < count:
        largest = max(range(len(groups)), key=lambda i: len(groups[i]))
        if len(groups[largest]) < 2:
            raise ValueError(f"cannot make {count} micro-batches from {sum(map(len, groups))} rows")
        group = groups.pop(largest)
        half = len(group) // 2
        groups[largest:largest] = [group[:half], group[half:]]
    return groups


def balanced_token_groups(lengths: Sequence[int], max_tokens: int, *, dp=None) -> list[list[int]]:
    """Micro-batches of a training mini-batch under a token budget, as verl 0.9.1's ``rearrange_micro_batches``:

    1. count = min(rows, ceil(sum(lengths) / max_tokens)), the largest over the data-parallel ranks;
    2. the rows are cut into ``count`` parts balanced by :func:`seqlen_workload` (Karmarkar-Karp,
       ``hybridflow.data.balance``); while a part holds more than ``max_tokens`` tokens on some rank, count + 1
       (a row longer than the budget alone ends the search at one row a micro-batch, where verl stops with an error);
    3. parts are ordered by workload, heaviest first, then the even-numbered ones reversed ahead of the odd ones
       (smaller micro-batches at both ends, verl's pipeline-bubble order).

    ``lengths``: valid tokens (prompt + response) of each row. Returns the row indices of each micro-batch.
    """
    sync = dp is not None and dp.world_size > 1
    count = min(len(lengths), -(-sum(lengths) // max_tokens))
    count = dp.all_reduce_max(count) if sync else count
    fewest_rows = -dp.all_reduce_max(-len(lengths)) if sync else len(lengths)
    workloads = [seqlen_workload(int(length)) for length in lengths]
    while True:
        groups = balance_partitions(workloads, count, equal_size=False)
        over = int(any(sum(lengths[i] for i in group) > max_tokens for group in groups))
        if not (dp.all_reduce_max(over) if sync else over) or count >= fewest_rows:
            break
        count += 1
    groups.sort(key=lambda group: (sum(workloads[i] for i in group), group[0]), reverse=True)
    return groups[::2][::-1] + groups[1::2]


@dataclass(frozen=True)
class LogProbBatching:
    """How a no-grad log-prob forward is cut: fixed ``micro_batch_size`` rows (None = all at once),
    or token-budget micro-batches of ``max_token_len`` when ``use_dynamic_bsz``."""

    micro_batch_size: int | None = None
    use_dynamic_bsz: bool = False
    max_token_len: int | None = None


def per_rank_micro_batch_size(per_gpu: int | None, deprecated_global: int | None, world_size: int) -> int | None:
    """verl's ``*_micro_batch_size_per_gpu``, or the deprecated global ``*_micro_batch_size``
    divided over the data-parallel ranks (at least 1) when only that one is set."""
    if per_gpu is not None or deprecated_global is None:
        return per_gpu
    return max(1, deprecated_global // world_size)


def mini_batches(batch: Batch, size: int, *, shuffle: bool, seed: int, step: int, epoch: int) -> list[Batch]:
    """Optimizer mini-batches of ``size`` rows; with ``shuffle`` the rows are permuted first, by a
    permutation fixed by (seed, step, epoch) so a resumed run sees the same mini-batches."""
    if shuffle:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + epoch)
        batch = batch.index_select(torch.randperm(len(batch), generator=gen))
    return batch.split(size)


def micro_batches(batch: Batch, *, micro_batch_size: int | None, use_dynamic_bsz: bool = False,
                  max_token_len: int | None = None, dp=None, packed: bool = False) -> list[Batch]:
    """Fixed-size micro-batches, or token-budget ones when ``use_dynamic_bsz`` (then, given the
    data-parallel context ``dp``, the same number on every rank); ``packed``: the forwards are packed
    rows, so the budget counts valid tokens (:func:`split_by_token_budget`)."""
    if use_dynamic_bsz:
        lengths = batch["attention_mask"].sum(-1).tolist()
        groups = split_by_token_budget(lengths, max_token_len, padded=not packed)
        if dp is not None and dp.world_size > 1:
            groups = split_to_count(groups, dp.all_reduce_max(len(groups)))
        return [batch.index_select(group) for group in groups]
    if micro_batch_size is None or micro_batch_size >= len(batch):
        return [batch]
    return batch.split(micro_batch_size)


def trim_padding(batch: Batch, *, response_length: int) -> tuple[slice, int]:
    """Columns of ``input_ids`` that hold any real token in this micro-batch.

    Left padding of prompts and right padding of responses are shared by the whole
    batch; dropping all-pad columns makes the forward cheaper without changing results.
    Returns the column slice and the response length inside it.
    """
    mask = batch["attention_mask"]
    used = mask.any(0).nonzero()
    start = int(used[0]) if used.numel() else 0
    prompt_len = mask.shape[1] - response_length
    start = min(start, prompt_len)
    resp_used = batch["response_mask"].any(0).nonzero()
    resp_len = int(resp_used[-1]) + 1 if resp_used.numel() else 1
    return slice(start, prompt_len + resp_len), resp_len


def trimmed_inputs(micro: Batch) -> tuple[dict[str, torch.Tensor], int]:
    """The padded-layout forward inputs (``input_ids`` / ``attention_mask`` / ``position_ids`` ``[b, L']``)
    without all-pad columns, and the response length ``T'`` inside them; :func:`pad_right` restores ``T``."""
    cols, resp_len = trim_padding(micro, response_length=micro["responses"].shape[1])
    return {key: micro[key][:, cols] for key in ("input_ids", "attention_mask", "position_ids")}, resp_len


def pad_right(values: torch.Tensor, length: int) -> torch.Tensor:
    """``[b, T', ...]`` per-response-token values back to ``[b, T, ...]`` with zeros on the trimmed columns."""
    if values.shape[1] == length:
        return values
    return torch.nn.functional.pad(values, (0, 0) * (values.dim() - 2) + (0, length - values.shape[1]))


def token_count(batch: Batch) -> torch.Tensor:
    """Number of valid response tokens."""
    return batch["response_mask"].sum()

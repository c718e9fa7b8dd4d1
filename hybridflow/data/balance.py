"""Sequence balancing across data-parallel ranks (``trainer.balance_batch``).

A step is as slow as its slowest rank, and a rank's forward/backward cost grows with
the tokens it holds. Before the data-parallel split, the batch is reordered so that
every rank gets the same number of sequences with (nearly) the same token sum.

The partition is the largest differencing method of Karmarkar & Karp, "The differencing
method of set partitioning" (1982), in its k-way, equal-cardinality form (as in verl's
``seqlen_balancing``): sequences sorted by length are taken k at a time into a k-part
partial solution (largest with smallest), and the two partial solutions with the
largest spread are merged repeatedly, pairing the heaviest part of one with the lightest
part of the other, until one k-part solution remains.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import torch

from hybridflow.errors import ConfigError


def seqlen_workload(length: int) -> int:
    """verl's estimate of a sequence's forward cost (a 7B dense block: 24576 L + L^2, linear layers plus attention)."""
    return 24576 * length + length * length


class _Part:
    """One part of a partial solution: its (index, length) items in the order they joined, and their sum."""

    def __init__(self, items: list[tuple[int, int]]):
        self.items = items
        self.sum = sum(length for _, length in items)

    def key(self) -> tuple:
        """verl's order of parts: by sum, then item count, then the items themselves (ties broken the same way)."""
        return self.sum, len(self.items), self.items


class _Partial:
    """k parts, kept sorted heaviest first (by ``_Part.key``)."""

    def __init__(self, parts: list[_Part]):
        self.parts = sorted(parts, key=_Part.key, reverse=True)

    @property
    def spread(self) -> int:
        return self.parts[0].sum - self.parts[-1].sum

    def merge(self, other: _Partial) -> _Partial:
        """Heaviest part here with the lightest there: the differencing step."""
        return _Partial([_Part(mine.items + theirs.items) for mine, theirs in zip(self.parts, reversed(other.parts))])

    def __lt__(self, other: _Partial) -> bool:
        # heapq is a min-heap: the largest spread pops first, then the one with the heaviest part (verl's order)
        if self.spread != other.spread:
            return self.spread > other.spread
        return self.parts[0].key() > other.parts[0].key()


def balance_partitions(lengths: Sequence[int], k: int, equal_size: bool = True) -> list[list[int]]:
    """Indices of ``lengths`` cut into ``k`` parts with balanced sums (each part sorted), heaviest part first;
    the same parts in the same order as verl 0.9.1's ``get_seqlen_balanced_partitions`` (ties included).

    ``equal_size`` (required for data-parallel dispatch) gives every part
    ``len(lengths) / k`` indices; otherwise each sequence is its own starting set and
    parts may differ in size.
    """
    if k < 1:
        raise ConfigError(f"cannot balance into {k} parts; the data-parallel size must be >= 1")
    if equal_size and len(lengths) % k:
        raise ConfigError(f"cannot balance {len(lengths)} sequences into {k} equal parts; "
                          f"make the batch size (train_batch_size * rollout.n) a multiple of {k}")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    group = k if equal_size else 1
    heap = []
    for start in range(0, len(order), group):
        chunk = order[start:start + group]
        parts = [_Part([(i, int(lengths[i]))]) for i in chunk] + [_Part([]) for _ in range(k - len(chunk))]
        heapq.heappush(heap, _Partial(parts))
    while len(heap) > 1:
        first, second = heapq.heappop(heap), heapq.heappop(heap)
        heapq.heappush(heap, first.merge(second))
    if not heap:
        return [[] for _ in range(k)]
    return [sorted(i for i, _ in part.items) for part in heap[0].parts]


def balanced_order(lengths: Sequence[int], k: int) -> tuple[list[int], list[list[int]]]:
    """A permutation that puts part r's sequences in the r-th of ``k`` equal chunks, and the parts."""
    parts = balance_partitions(lengths, k, equal_size=True)
    return [i for part in parts for i in part], parts


def balance_batch(batch, *, dp_size: int, groups: Sequence | None = None) -> dict[str, float]:
    """Reorder ``batch`` rows in place of its columns so ``batch.chunk(dp_size)`` is token-balanced.

    Token count = ``attention_mask.sum(-1)`` (prompt + response). With ``groups`` (a group id per row, e.g. the
    prompt's ``uid``) whole groups are balanced instead, their rows kept together and in order (GVPO's recipe
    balances prompt groups the same way). Returns detached metrics: the max/min tokens per rank before and after.
    """
    lengths = batch["attention_mask"].sum(-1).tolist()
    before = [sum(chunk) for chunk in _equal_chunks(lengths, dp_size)]
    order, parts = balanced_order(lengths, dp_size) if groups is None else _group_order(lengths, groups, dp_size)
    reordered = batch.index_select(torch.tensor(order))
    for key in reordered.keys():
        batch[key] = reordered[key]
    after = [sum(lengths[i] for i in part) for part in parts]
    return {"balance/tokens_max_over_min_before": max(before) / max(min(before), 1),
            "balance/tokens_max_over_min_after": max(after) / max(min(after), 1)}


def _group_order(lengths: list[int], groups: Sequence, k: int) -> tuple[list[int], list[list[int]]]:
    """:func:`balanced_order` over whole groups: each part holds whole groups, the rows of a group adjacent."""
    members: dict = {}
    for row, group in enumerate(groups):
        members.setdefault(group, []).append(row)
    rows = list(members.values())
    if len(rows) % k:
        raise ConfigError(f"cannot balance {len(rows)} prompt groups into {k} data shards of whole groups; "
                          f"make data.train_batch_size a multiple of {k}")
    parts = balance_partitions([sum(lengths[i] for i in group) for group in rows], k, equal_size=True)
    row_parts = [[i for g in part for i in rows[g]] for part in parts]
    return [i for part in row_parts for i in part], row_parts


def _equal_chunks(values: list[int], k: int) -> list[list[int]]:
    size = len(values) // k
    return [values[r * size:(r + 1) * size] for r in range(k)]

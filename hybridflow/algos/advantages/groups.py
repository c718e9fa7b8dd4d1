"""Per-group statistics of outcome scores for the group-relative estimators.

``index`` gives each of the ``B`` samples a group id (any hashable: prompt uids, ints);
samples that share an id are responses to the same prompt.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from hybridflow.algos.errors import AlgorithmError


def group_ids(
    *, index: Sequence | np.ndarray | torch.Tensor, batch_size: int, device: torch.device | None = None
) -> torch.Tensor:
    """Dense ids ``[B]`` in 0..G-1, numbered in order of first appearance."""
    # tolist(): numpy scalars / 0-d tensors would hash by identity or dtype, not value.
    keys = index.tolist() if isinstance(index, (np.ndarray, torch.Tensor)) else list(index)
    if len(keys) != batch_size:
        raise AlgorithmError(
            f"index has {len(keys)} entries for a batch of {batch_size}; pass one group id (prompt uid) per sample"
        )
    lookup: dict = {}
    dense = [lookup.setdefault(key, len(lookup)) for key in keys]
    return torch.tensor(dense, dtype=torch.long, device=device)


def _num_groups(ids: torch.Tensor) -> int:
    return int(ids.max()) + 1 if ids.numel() else 0


def group_sum(*, values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Sum of ``values`` ``[B]`` per group, broadcast back to ``[B]``."""
    totals = torch.zeros(_num_groups(ids), dtype=values.dtype, device=values.device)
    return totals.index_add(0, ids, values)[ids]


def group_first(*, values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The value of each group's first member, broadcast to ``[B]``."""
    positions = torch.arange(len(ids), device=ids.device)
    first_position = torch.full((_num_groups(ids),), len(ids), device=ids.device)
    first_position = first_position.scatter_reduce(0, ids, positions, reduce="amin")
    return values[first_position][ids]


def group_weighted_mean(*, values: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """sum_g(w x) / sum_g(w) per sample ``[B]`` (the first value if the weights sum to 0).

    Taken around the group's first value so that a group of identical values has a mean
    equal to them bit for bit and a centred value of exactly 0 (sum(x) / n can be off
    by an ulp, which a 1e-6 std would blow up to ~1e-2).
    """
    shift = group_first(values=values, ids=ids)
    total_weight = group_sum(values=weights, ids=ids)
    return shift + group_sum(values=weights * (values - shift), ids=ids) / total_weight.clamp(min=1e-12)


def group_mean_std(*, scores: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample group mean, unbiased group std (0 for a group of one) and group size, ``[B]``."""
    count = group_sum(values=torch.ones_like(scores), ids=ids)
    mean = group_weighted_mean(values=scores, weights=torch.ones_like(scores), ids=ids)
    squared = group_sum(values=(scores - mean).square(), ids=ids)
    std = (squared / (count - 1).clamp(min=1)).sqrt()
    return mean, std, count

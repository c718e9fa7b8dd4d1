"""OPO outcome advantages (``adv_estimator=opo``).

Hao et al., "On-Policy RL with Optimal Reward Baseline" (arXiv 2505.23585):
the variance-minimising baseline under the assumption that the squared gradient norm
grows with response length, i.e. a length-weighted group mean::

    b = sum_j |y_j| r_j / sum_j |y_j|,        A_i = r_i - b

on every valid token. A group of one has b = 0 (verl's convention).
"""

from __future__ import annotations

import torch

from hybridflow.algos.advantages.groups import group_ids, group_sum, group_weighted_mean
from hybridflow.algos.registry import register_advantage


@register_advantage("opo")
@torch.no_grad()
def opo_advantage(
    *, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index, **_
) -> tuple[torch.Tensor, torch.Tensor]:
    """Length-weighted group baseline advantage ``[B, T]``; returns equal the advantages."""
    scores = token_level_rewards.sum(dim=-1)
    mask = response_mask.to(scores.dtype)
    lengths = mask.sum(dim=-1)
    ids = group_ids(index=index, batch_size=len(scores), device=scores.device)
    count = group_sum(values=torch.ones_like(scores), ids=ids)
    baseline = group_weighted_mean(values=scores, weights=lengths, ids=ids)
    baseline = torch.where(count > 1, baseline, torch.zeros_like(baseline))
    advantages = (scores - baseline)[:, None] * mask
    return advantages, advantages

"""RLOO outcome advantages (``adv_estimator=rloo``).

Ahmadian et al., "Back to Basics: Revisiting REINFORCE Style Optimization" (arXiv
2402.14740), after Kool et al. 2019: each of the n responses to a prompt is
baselined by the mean score of the other n - 1::

    A_i = r_i - 1/(n-1) sum_{j != i} r_j = n/(n-1) * (r_i - mean(r))

A group of one has no other sample: A = r (verl's convention).
"""

from __future__ import annotations

import torch

from hybridflow.algos.advantages.groups import group_ids, group_mean_std
from hybridflow.algos.registry import register_advantage


@register_advantage("rloo")
@torch.no_grad()
def rloo_advantage(
    *, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index, **_
) -> tuple[torch.Tensor, torch.Tensor]:
    """Leave-one-out outcome advantage ``[B, T]``; returns equal the advantages."""
    scores = token_level_rewards.sum(dim=-1)
    ids = group_ids(index=index, batch_size=len(scores), device=scores.device)
    mean, _, count = group_mean_std(scores=scores, ids=ids)
    # the n/(n-1) form, not r - mean(others): it inherits the exact-zero centring of
    # group_mean_std for identical scores. The where keeps a singleton's r (no 0/0).
    leave_one_out = (scores - mean) * count / (count - 1).clamp(min=1)
    advantage = torch.where(count > 1, leave_one_out, scores)
    advantages = advantage[:, None] * response_mask.to(scores.dtype)
    return advantages, advantages

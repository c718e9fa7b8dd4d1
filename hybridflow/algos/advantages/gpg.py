"""GPG outcome advantages (``adv_estimator=gpg``).

Chu et al., "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
Reasoning" (arXiv 2504.02546): group-mean-centred scores without std normalisation,
rescaled so that samples that carry no signal do not dilute the batch::

    A_i = alpha * (r_i - mean_group(r)) / F_norm,   alpha = B / max(M, 1)

with M the number of samples with a non-zero score, as in verl (the paper counts the
samples whose advantage is non-zero; the two agree for 0/1 rewards when every group
has a mix). F_norm = 1. A group of one has mean 0.
"""

from __future__ import annotations

import torch

from hybridflow.algos.advantages.groups import group_ids, group_mean_std
from hybridflow.algos.registry import register_advantage


@register_advantage("gpg")
@torch.no_grad()
def gpg_advantage(
    *, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index, **_
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rescaled group-centred outcome advantage ``[B, T]``; returns equal the advantages."""
    scores = token_level_rewards.sum(dim=-1)
    ids = group_ids(index=index, batch_size=len(scores), device=scores.device)
    mean, _, count = group_mean_std(scores=scores, ids=ids)
    centred = scores - torch.where(count > 1, mean, torch.zeros_like(mean))
    alpha = len(scores) / max(int(torch.count_nonzero(scores)), 1)
    advantages = (alpha * centred)[:, None] * response_mask.to(scores.dtype)
    return advantages, advantages

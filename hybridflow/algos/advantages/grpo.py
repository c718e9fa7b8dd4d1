"""GRPO and Dr.GRPO outcome advantages (``adv_estimator=grpo``).

Shao et al., DeepSeekMath (arXiv 2402.03300), section 4.1.2, outcome supervision: for
the G responses to one prompt with scores r_1..r_G::

    A_i = (r_i - mean(r)) / (std(r) + eps)       (std unbiased, as torch.std / verl)

and the same A_i on every response token. Liu et al., Dr.GRPO (arXiv 2503.20783)
drop the division by std (``norm_adv_by_std_in_grpo=False``) because it up-weights
prompts that are nearly always right or nearly always wrong. A group of one has no
baseline: mean 0 and std 1 (verl's convention), so A = r (or r / (1 + eps)).
"""

from __future__ import annotations

import torch

from hybridflow.algos.advantages.groups import group_ids, group_mean_std
from hybridflow.algos.registry import register_advantage


def grpo_group_baseline(
    *, scores: torch.Tensor, index, epsilon: float, norm_by_std: bool
) -> torch.Tensor:
    """(r - group mean) [/ (group std + eps)] per sample ``[B]``; singleton groups keep r."""
    ids = group_ids(index=index, batch_size=len(scores), device=scores.device)
    mean, std, count = group_mean_std(scores=scores, ids=ids)
    singleton = count == 1
    centred = scores - torch.where(singleton, torch.zeros_like(mean), mean)
    if not norm_by_std:
        return centred
    return centred / (torch.where(singleton, torch.ones_like(std), std) + epsilon)


@register_advantage("grpo")
@torch.no_grad()
def grpo_advantage(
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
    **_,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-normalised outcome advantage ``[B, T]``; returns equal the advantages."""
    scores = token_level_rewards.sum(dim=-1)
    advantage = grpo_group_baseline(
        scores=scores, index=index, epsilon=epsilon, norm_by_std=norm_adv_by_std_in_grpo
    )
    advantages = advantage[:, None] * response_mask.to(scores.dtype)
    return advantages, advantages

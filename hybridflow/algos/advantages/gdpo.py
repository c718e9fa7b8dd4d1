"""GDPO: group-normalise each reward component separately, then sum (``adv_estimator=gdpo``).

"GDPO: Group reward-Decoupled Normalization Policy Optimization" (arXiv 2601.05242): with
several rewards (format, accuracy, length, ...), GRPO normalises their sum, so a component
with a large spread drowns the others. GDPO normalises each component r^k within its
group first, as GRPO does, then takes a weighted sum and whitens it over the batch::

    A^k_i = (r^k_i - mean_g r^k) / (std_g r^k + eps)      (GRPO per component; no std
                                                           division when norm_adv_by_std_in_grpo=False)
    A_i   = sum_k w_k A^k_i                              (w = algorithm.gdpo_reward_weights, default 1)
    A     = whiten_batch(A_i on every valid token)       [B, T]

``reward_components`` ``{name: [B]}`` come from the reward function's dict
(``algorithm.gdpo_reward_keys``); without them the summed token-level reward is the single
component (verl's fallback), and GDPO is GRPO followed by batch whitening.
"""

from __future__ import annotations

import torch

from hybridflow.algos.advantages.grpo import grpo_group_baseline
from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.registry import register_advantage
from hybridflow.algos.stats import masked_whiten


@register_advantage("gdpo")
@torch.no_grad()
def gdpo_advantage(
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index,
    reward_components: dict[str, torch.Tensor] | None = None,
    reward_weights: list[float] | None = None,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
    **_,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoupled-normalisation advantage ``[B, T]``; returns equal the advantages."""
    mask = response_mask.to(token_level_rewards.dtype)
    components = list((reward_components or {"score": token_level_rewards.sum(dim=-1)}).values())
    weights = [1.0] * len(components) if reward_weights is None else list(reward_weights)
    if len(weights) != len(components):
        raise AlgorithmError(f"gdpo: {len(weights)} reward weights for {len(components)} reward components; "
                             "give algorithm.gdpo_reward_weights one weight per gdpo_reward_keys entry")
    combined = torch.zeros_like(token_level_rewards[:, 0])
    for weight, scores in zip(weights, components):
        combined = combined + weight * grpo_group_baseline(scores=scores.to(combined.dtype), index=index,
                                                           epsilon=epsilon, norm_by_std=norm_adv_by_std_in_grpo)
    advantages = masked_whiten(values=combined[:, None] * mask, mask=mask) * mask
    return advantages, advantages

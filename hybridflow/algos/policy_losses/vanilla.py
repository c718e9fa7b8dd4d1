"""PPO's clipped surrogate with clip-higher and dual-clip (``loss_mode=vanilla``).

Schulman et al., PPO (arXiv 1707.06347), eq. 7, with the decoupled bounds of DAPO's
clip-higher (Yu et al., arXiv 2503.14476) and the dual clip of Ye et al. (arXiv
1912.09729) for negative advantages. With rho = pi_theta / pi_old per token::

    l_clip = max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high))
    l      = min(l_clip, -A c)   if A < 0        (c = clip_ratio_c > 1)
             l_clip              otherwise
    loss   = agg(l)                                (loss_agg_mode, see agg.py)

Metrics (masked token means): ``pg_clipfrac`` (clipped term chosen), ``pg_clipfrac_lower``
(dual clip active), ``ppo_kl`` = mean(log pi_old - log pi_theta) (the k1 estimate).
"""

from __future__ import annotations

import torch

from hybridflow.algos.agg import agg_loss
from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.policy_losses.common import (
    clamped_log_ratio,
    clip_range,
    clipped_surrogate,
    policy_loss_metrics,
    select_valid,
    weight_by_rollout_is,
)
from hybridflow.algos.registry import register_policy_loss


@register_policy_loss("vanilla")
def vanilla_policy_loss(
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    global_num_tokens: float | None = None,
    global_num_seqs: float | None = None,
    max_response_length: int | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    **_,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped PPO loss over ``[B, T]`` inputs; see the module docstring."""
    log_prob, old_log_prob = select_valid(log_prob=log_prob, old_log_prob=old_log_prob, response_mask=response_mask)
    if clip_ratio_c <= 1.0:
        raise AlgorithmError(
            f"clip_ratio_c must be > 1 for the dual clip, got {clip_ratio_c}; set actor.clip_ratio_c=3.0"
        )
    low, high = clip_range(clip_ratio=clip_ratio, clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high)
    log_ratio = clamped_log_ratio(log_prob=log_prob, old_log_prob=old_log_prob)
    clip_loss, clipped = clipped_surrogate(ratio=log_ratio.exp(), advantages=advantages, clip_low=low, clip_high=high)
    dual_bound = -advantages * clip_ratio_c
    losses = torch.where(advantages < 0, torch.minimum(clip_loss, dual_bound), clip_loss)
    loss = agg_loss(
        loss_mat=weight_by_rollout_is(losses=losses, rollout_is_weights=rollout_is_weights),
        loss_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        max_response_length=max_response_length,
    )
    lower_clipped = (clip_loss > dual_bound) & (advantages < 0)
    metrics = policy_loss_metrics(log_ratio=log_ratio, response_mask=response_mask, clipped=clipped,
                                  clipped_lower=lower_clipped)
    return loss, metrics

"""CISPO: clipped importance-sampling weights, every token keeps its gradient (``loss_mode=cispo``).

MiniMax, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention"
(arXiv 2506.13585): PPO's clip drops the gradient of tokens whose ratio
left the trust region (often rare, high-entropy "fork" tokens); CISPO instead clips
the importance weight and stops its gradient, so every token contributes::

    w_t  = sg( clip(rho_t, 1 - eps_low, 1 + eps_high) )
    l_t  = -w_t A_t log pi_theta(y_t)          [B, T]
    loss = agg(l)                              (the paper uses token-mean)

The paper sets no lower bound (eps_low large): pass ``clip_ratio_low=1.0`` for that.
``pg_clipfrac`` is the fraction of tokens whose weight was clipped, ``pg_clipfrac_lower``
those clipped from below.
"""

from __future__ import annotations

import torch

from hybridflow.algos.agg import agg_loss
from hybridflow.algos.policy_losses.common import (
    clamped_log_ratio,
    clip_range,
    policy_loss_metrics,
    select_valid,
    weight_by_rollout_is,
)
from hybridflow.algos.registry import register_policy_loss


@register_policy_loss("cispo")
def cispo_policy_loss(
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    global_num_tokens: float | None = None,
    global_num_seqs: float | None = None,
    max_response_length: int | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    **_,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO loss over ``[B, T]`` inputs; see the module docstring."""
    log_prob, old_log_prob = select_valid(log_prob=log_prob, old_log_prob=old_log_prob, response_mask=response_mask)
    low, high = clip_range(clip_ratio=clip_ratio, clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high)
    log_ratio = clamped_log_ratio(log_prob=log_prob, old_log_prob=old_log_prob).detach()
    ratio = log_ratio.exp()
    weight = ratio.clamp(1 - low, 1 + high)
    loss = agg_loss(
        loss_mat=weight_by_rollout_is(losses=-advantages * weight * log_prob, rollout_is_weights=rollout_is_weights),
        loss_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        max_response_length=max_response_length,
    )
    metrics = policy_loss_metrics(log_ratio=log_ratio, response_mask=response_mask, clipped=weight != ratio,
                                  clipped_lower=ratio < 1 - low)
    return loss, metrics

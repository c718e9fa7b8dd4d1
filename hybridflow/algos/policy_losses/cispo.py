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

from hybridflow.algos.policy_losses.common import (
    ClipConfig,
    LossAggregation,
    PolicyLossInputs,
    clamped_log_ratio,
    policy_loss_metrics,
)
from hybridflow.algos.registry import register_policy_loss


@register_policy_loss("cispo", config=ClipConfig)
def cispo_policy_loss(inputs: PolicyLossInputs, config: ClipConfig,
                      agg: LossAggregation) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO loss over ``[B, T]`` inputs; see the module docstring."""
    low, high = config.bounds()
    log_ratio = clamped_log_ratio(log_prob=inputs.log_prob, old_log_prob=inputs.old_log_prob).detach()
    ratio = log_ratio.exp()
    weight = ratio.clamp(1 - low, 1 + high)
    loss = agg(-inputs.advantages * weight * inputs.log_prob, inputs=inputs)
    metrics = policy_loss_metrics(log_ratio=log_ratio, response_mask=inputs.response_mask, clipped=weight != ratio,
                                  clipped_lower=ratio < 1 - low)
    return loss, metrics

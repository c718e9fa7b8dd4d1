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

from dataclasses import dataclass

import torch

from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.policy_losses.common import (
    ClipConfig,
    LossAggregation,
    PolicyLossInputs,
    clamped_log_ratio,
    clipped_surrogate,
    policy_loss_metrics,
)
from hybridflow.algos.registry import register_policy_loss


@dataclass(frozen=True)
class VanillaConfig(ClipConfig):
    """The ratio clip plus the dual-clip bound c for negative advantages."""

    clip_ratio_c: float = 3.0


@register_policy_loss("vanilla", config=VanillaConfig)
def vanilla_policy_loss(inputs: PolicyLossInputs, config: VanillaConfig,
                        agg: LossAggregation) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped PPO loss over ``[B, T]`` inputs; see the module docstring."""
    if config.clip_ratio_c <= 1.0:
        raise AlgorithmError(
            f"clip_ratio_c must be > 1 for the dual clip, got {config.clip_ratio_c}; set actor.clip_ratio_c=3.0"
        )
    low, high = config.bounds()
    advantages = inputs.advantages
    log_ratio = clamped_log_ratio(log_prob=inputs.log_prob, old_log_prob=inputs.old_log_prob)
    clip_loss, clipped = clipped_surrogate(ratio=log_ratio.exp(), advantages=advantages, clip_low=low, clip_high=high)
    dual_bound = -advantages * config.clip_ratio_c
    losses = torch.where(advantages < 0, torch.minimum(clip_loss, dual_bound), clip_loss)
    lower_clipped = (clip_loss > dual_bound) & (advantages < 0)
    metrics = policy_loss_metrics(log_ratio=log_ratio, response_mask=inputs.response_mask, clipped=clipped,
                                  clipped_lower=lower_clipped)
    return agg(losses, inputs=inputs), metrics

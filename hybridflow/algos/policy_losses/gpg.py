"""GPG: plain policy gradient, no ratio and no clipping (``loss_mode=gpg``).

Chu et al., "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
Reasoning" (arXiv 2504.02546), the GPG objective::

    l_t  = -A_t log pi_theta(y_t)          [B, T]
    loss = agg(l)

Pair it with ``adv_estimator=gpg``. Being on-policy by construction it has no
clip fraction; ``ppo_kl`` is still reported to watch for staleness.
"""

from __future__ import annotations

import torch

from hybridflow.algos.policy_losses.common import LossAggregation, NoKnobs, PolicyLossInputs, policy_loss_metrics
from hybridflow.algos.registry import register_policy_loss


@register_policy_loss("gpg")
def gpg_policy_loss(inputs: PolicyLossInputs, config: NoKnobs,
                    agg: LossAggregation) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE loss -A log pi over ``[B, T]`` inputs."""
    loss = agg(-inputs.advantages * inputs.log_prob, inputs=inputs)
    return loss, policy_loss_metrics(log_ratio=inputs.log_prob - inputs.old_log_prob,
                                     response_mask=inputs.response_mask)

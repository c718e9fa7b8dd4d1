"""DRO: direct reward optimisation with a quadratic log-ratio penalty (``loss_mode=dro``).

Richemond et al., "Offline Regularised Reinforcement Learning for Large Language
Models Alignment" (arXiv 2405.19107), in verl's on-policy token form: a policy-gradient
term plus a squared trust-region penalty on the per-token log-ratio to pi_old::

    l_t  = -( A_t log pi_theta(y_t) - beta/2 (log pi_theta(y_t) - log pi_old(y_t))^2 )   [B, T]
    loss = agg(l)

``beta`` is ``actor.policy_loss.dro_beta`` (no default: it must be set, > 0). The paper
learns a value function beside the policy; verl (and we) take A from the configured
advantage estimator instead. The log-ratio is not clamped (it is squared, not exponentiated).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.policy_losses.common import LossAggregation, PolicyLossInputs, policy_loss_metrics
from hybridflow.algos.registry import register_policy_loss

@dataclass(frozen=True)
class DROConfig:
    """The weight of the squared log-ratio penalty (no default: it must be set, > 0)."""

    dro_beta: float | None = None


def beta_problems(setting) -> list[str]:
    """loss_mode=dro without a positive beta, found before any model loads."""
    if (setting("actor_rollout_ref.actor.policy_loss.dro_beta") or 0) > 0:
        return []
    return ["actor_rollout_ref.actor.policy_loss.loss_mode=dro needs policy_loss.dro_beta > 0 (e.g. 0.1)"]


@register_policy_loss("dro", config=DROConfig, knobs={"dro_beta": "actor_rollout_ref.actor.policy_loss.dro_beta"},
                      check=beta_problems)
def dro_policy_loss(inputs: PolicyLossInputs, config: DROConfig,
                    agg: LossAggregation) -> tuple[torch.Tensor, dict[str, float]]:
    """DRO loss over ``[B, T]`` inputs; see the module docstring."""
    beta = config.dro_beta
    if beta is None or beta <= 0:
        raise AlgorithmError(f"loss_mode=dro needs a positive beta, got {beta}; "
                             "set actor_rollout_ref.actor.policy_loss.dro_beta (e.g. 0.1)")
    log_ratio = inputs.log_prob - inputs.old_log_prob
    losses = -(inputs.log_prob * inputs.advantages - 0.5 * beta * log_ratio.square())
    return agg(losses, inputs=inputs), policy_loss_metrics(log_ratio=log_ratio, response_mask=inputs.response_mask)

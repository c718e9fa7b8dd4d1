"""SAPO: a smooth, temperature-gated surrogate instead of a hard clip (``loss_mode=sapo``).

"Soft Adaptive Policy Optimization" (SAPO, arXiv 2511.20347). With
rho = pi_theta / pi_old per token and a temperature tau that depends on the sign of A::

    f(rho; tau) = sigma(tau (rho - 1)) * 4 / tau        (slope 1 at rho = 1, like rho itself)
    tau_t       = tau_pos if A_t > 0 else tau_neg
    l_t         = -f(rho_t; tau_t) A_t                  [B, T]
    loss        = seq-mean-token-mean(l)               (always, as verl does)

The gate's gradient is rho-weighted and decays smoothly away from rho = 1, so off-policy
tokens are down-weighted rather than cut off. Like verl, the aggregation is fixed to
``seq-mean-token-mean`` (the paper's sequence average) whatever ``loss_agg_mode`` says.
No clip: ``pg_clipfrac`` and ``pg_clipfrac_lower`` are 0.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.policy_losses.common import (
    LossAggregation,
    PolicyLossInputs,
    clamped_log_ratio,
    policy_loss_metrics,
)
from hybridflow.algos.registry import register_policy_loss


@dataclass(frozen=True)
class SAPOConfig:
    """The gate temperatures for positive and negative advantages (``actor.tau_pos`` / ``actor.tau_neg``)."""

    tau_pos: float = 1.0
    tau_neg: float = 1.05


def sapo_gate(*, ratio: torch.Tensor, tau: torch.Tensor | float) -> torch.Tensor:
    """f(rho; tau) = sigmoid(tau (rho - 1)) * 4 / tau, elementwise."""
    return torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)


@register_policy_loss("sapo", config=SAPOConfig,
                      knobs={"tau_pos": "actor_rollout_ref.actor.tau_pos",
                             "tau_neg": "actor_rollout_ref.actor.tau_neg"})
def sapo_policy_loss(inputs: PolicyLossInputs, config: SAPOConfig,
                     agg: LossAggregation) -> tuple[torch.Tensor, dict[str, float]]:
    """SAPO loss over ``[B, T]`` inputs (``actor.tau_pos`` / ``actor.tau_neg``); see the module docstring."""
    tau_pos, tau_neg = config.tau_pos, config.tau_neg
    if tau_pos <= 0 or tau_neg <= 0:
        raise AlgorithmError(f"sapo needs positive temperatures, got tau_pos={tau_pos}, tau_neg={tau_neg}; "
                             "set actor_rollout_ref.actor.tau_pos / tau_neg > 0")
    advantages = inputs.advantages
    log_ratio = clamped_log_ratio(log_prob=inputs.log_prob, old_log_prob=inputs.old_log_prob)
    tau = torch.where(advantages > 0, torch.full_like(advantages, tau_pos), torch.full_like(advantages, tau_neg))
    losses = -sapo_gate(ratio=log_ratio.exp(), tau=tau) * advantages
    # the paper's aggregation, whatever loss_agg_mode says
    sequence_mean = dataclasses.replace(agg, loss_agg_mode="seq-mean-token-mean", max_response_length=None)
    return sequence_mean(losses, inputs=inputs), policy_loss_metrics(log_ratio=log_ratio,
                                                                     response_mask=inputs.response_mask)

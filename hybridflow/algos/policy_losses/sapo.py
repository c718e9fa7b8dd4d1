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

import torch

from hybridflow.algos.agg import agg_loss
from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.policy_losses.common import (
    clamped_log_ratio,
    policy_loss_metrics,
    select_valid,
    weight_by_rollout_is,
)
from hybridflow.algos.registry import register_policy_loss


def sapo_gate(*, ratio: torch.Tensor, tau: torch.Tensor | float) -> torch.Tensor:
    """f(rho; tau) = sigmoid(tau (rho - 1)) * 4 / tau, elementwise."""
    return torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)


@register_policy_loss("sapo")
def sapo_policy_loss(
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    global_num_tokens: float | None = None,
    global_num_seqs: float | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    **_,
) -> tuple[torch.Tensor, dict[str, float]]:
    """SAPO loss over ``[B, T]`` inputs (``actor.tau_pos`` / ``actor.tau_neg``); see the module docstring."""
    log_prob, old_log_prob = select_valid(log_prob=log_prob, old_log_prob=old_log_prob, response_mask=response_mask)
    if tau_pos <= 0 or tau_neg <= 0:
        raise AlgorithmError(f"sapo needs positive temperatures, got tau_pos={tau_pos}, tau_neg={tau_neg}; "
                             "set actor_rollout_ref.actor.tau_pos / tau_neg > 0")
    log_ratio = clamped_log_ratio(log_prob=log_prob, old_log_prob=old_log_prob)
    tau = torch.where(advantages > 0, torch.full_like(advantages, tau_pos), torch.full_like(advantages, tau_neg))
    losses = -sapo_gate(ratio=log_ratio.exp(), tau=tau) * advantages
    loss = agg_loss(
        loss_mat=weight_by_rollout_is(losses=losses, rollout_is_weights=rollout_is_weights),
        loss_mask=response_mask,
        loss_agg_mode="seq-mean-token-mean",
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
    )
    return loss, policy_loss_metrics(log_ratio=log_ratio, response_mask=response_mask)

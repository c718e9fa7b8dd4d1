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

import torch

from hybridflow.algos.agg import agg_loss
from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.policy_losses.common import policy_loss_metrics, select_valid, weight_by_rollout_is
from hybridflow.algos.registry import register_policy_loss


@register_policy_loss("dro")
def dro_policy_loss(
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    dro_beta: float | None = None,
    loss_agg_mode: str = "token-mean",
    global_num_tokens: float | None = None,
    global_num_seqs: float | None = None,
    max_response_length: int | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    **_,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DRO loss over ``[B, T]`` inputs; see the module docstring."""
    log_prob, old_log_prob = select_valid(log_prob=log_prob, old_log_prob=old_log_prob, response_mask=response_mask)
    if dro_beta is None or dro_beta <= 0:
        raise AlgorithmError(f"loss_mode=dro needs a positive beta, got {dro_beta}; "
                             "set actor_rollout_ref.actor.policy_loss.dro_beta (e.g. 0.1)")
    log_ratio = log_prob - old_log_prob
    losses = -(log_prob * advantages - 0.5 * dro_beta * log_ratio.square())
    loss = agg_loss(
        loss_mat=weight_by_rollout_is(losses=losses, rollout_is_weights=rollout_is_weights),
        loss_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        max_response_length=max_response_length,
    )
    return loss, policy_loss_metrics(log_ratio=log_ratio, response_mask=response_mask)

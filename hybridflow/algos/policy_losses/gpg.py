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

from hybridflow.algos.agg import agg_loss
from hybridflow.algos.policy_losses.common import policy_loss_metrics, select_valid, weight_by_rollout_is
from hybridflow.algos.registry import register_policy_loss


@register_policy_loss("gpg")
def gpg_policy_loss(
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    global_num_tokens: float | None = None,
    global_num_seqs: float | None = None,
    max_response_length: int | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    **_,
) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE loss -A log pi over ``[B, T]`` inputs."""
    log_prob, old_log_prob = select_valid(log_prob=log_prob, old_log_prob=old_log_prob, response_mask=response_mask)
    loss = agg_loss(
        loss_mat=weight_by_rollout_is(losses=-advantages * log_prob, rollout_is_weights=rollout_is_weights),
        loss_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        max_response_length=max_response_length,
    )
    metrics = policy_loss_metrics(log_ratio=log_prob - old_log_prob, response_mask=response_mask)
    return loss, metrics

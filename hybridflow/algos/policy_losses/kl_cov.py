"""KL-Cov (``loss_mode=kl_cov``): a KL penalty on the highest-covariance tokens.

Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models" (arXiv 2505.22617): the top ``max(1, floor(kl_cov_ratio * N))``
valid tokens by covariance (covariance.py) get an |log-ratio| penalty, the rest the
unclipped policy gradient::

    l_t  = -A rho + beta |log rho|    for the top-k tokens     (beta = ppo_kl_coef)
           -A rho                     otherwise
    loss = agg(l)

``pg_clipfrac`` reports the fraction of penalised tokens (verl reports 0) and
``ppo_kl_abs`` the mean |log rho| (what verl reports as ``ppo_kl``).
"""

from __future__ import annotations

import torch

from hybridflow.algos.agg import agg_loss
from hybridflow.algos.policy_losses.common import (
    clamped_log_ratio,
    policy_loss_metrics,
    select_valid,
    weight_by_rollout_is,
)
from hybridflow.algos.policy_losses.covariance import check_token_ratio, covariance_token_count, token_covariance
from hybridflow.algos.registry import register_policy_loss
from hybridflow.algos.stats import masked_mean


def top_covariance_tokens(*, cov: torch.Tensor, valid: torch.Tensor, ratio: float) -> torch.Tensor:
    """A bool mask ``[B, T]`` of the ``max(1, floor(ratio * N))`` valid tokens with largest cov."""
    num_valid = int(valid.sum())
    chosen = torch.zeros(cov.numel(), dtype=torch.bool, device=cov.device)
    if num_valid:
        count = covariance_token_count(ratio=ratio, num_valid=num_valid)
        chosen[cov.masked_fill(~valid, -torch.inf).flatten().topk(count).indices] = True
    return chosen.view_as(cov)


@register_policy_loss("kl_cov")
def kl_cov_policy_loss(
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    kl_cov_ratio: float = 2e-4,
    ppo_kl_coef: float = 1.0,
    global_num_tokens: float | None = None,
    global_num_seqs: float | None = None,
    max_response_length: int | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    **_,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-Cov loss over ``[B, T]`` inputs; see the module docstring."""
    log_prob, old_log_prob = select_valid(log_prob=log_prob, old_log_prob=old_log_prob, response_mask=response_mask)
    check_token_ratio(name="kl_cov_ratio", ratio=kl_cov_ratio)
    log_ratio = clamped_log_ratio(log_prob=log_prob, old_log_prob=old_log_prob)
    policy_gradient = -advantages * log_ratio.exp()
    cov = token_covariance(advantages=advantages, log_prob=log_prob, response_mask=response_mask)
    penalised = top_covariance_tokens(cov=cov, valid=response_mask > 0, ratio=kl_cov_ratio)
    losses = torch.where(penalised, policy_gradient + ppo_kl_coef * log_ratio.abs(), policy_gradient)
    loss = agg_loss(
        loss_mat=weight_by_rollout_is(losses=losses, rollout_is_weights=rollout_is_weights),
        loss_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        max_response_length=max_response_length,
    )
    metrics = {
        **policy_loss_metrics(log_ratio=log_ratio, response_mask=response_mask, clipped=penalised),
        "ppo_kl_abs": masked_mean(values=log_ratio.detach().abs(), mask=response_mask).item(),
    }
    return loss, metrics

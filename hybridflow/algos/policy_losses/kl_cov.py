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

from dataclasses import dataclass

import torch

from hybridflow.algos.policy_losses.common import (
    LossAggregation,
    PolicyLossInputs,
    clamped_log_ratio,
    policy_loss_metrics,
)
from hybridflow.algos.policy_losses.covariance import check_token_ratio, covariance_token_count, token_covariance
from hybridflow.algos.registry import register_policy_loss
from hybridflow.algos.stats import masked_mean

@dataclass(frozen=True)
class KLCovConfig:
    """The share of tokens penalised and the weight of their |log-ratio| penalty."""

    kl_cov_ratio: float = 2e-4
    ppo_kl_coef: float = 1.0


def top_covariance_tokens(*, cov: torch.Tensor, valid: torch.Tensor, ratio: float) -> torch.Tensor:
    """A bool mask ``[B, T]`` of the ``max(1, floor(ratio * N))`` valid tokens with largest cov."""
    num_valid = int(valid.sum())
    chosen = torch.zeros(cov.numel(), dtype=torch.bool, device=cov.device)
    if num_valid:
        count = covariance_token_count(ratio=ratio, num_valid=num_valid)
        chosen[cov.masked_fill(~valid, -torch.inf).flatten().topk(count).indices] = True
    return chosen.view_as(cov)


@register_policy_loss("kl_cov", config=KLCovConfig,
                      knobs={"kl_cov_ratio": "actor_rollout_ref.actor.policy_loss.kl_cov_ratio",
                             "ppo_kl_coef": "actor_rollout_ref.actor.policy_loss.ppo_kl_coef"})
def kl_cov_policy_loss(inputs: PolicyLossInputs, config: KLCovConfig,
                       agg: LossAggregation) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-Cov loss over ``[B, T]`` inputs; see the module docstring."""
    check_token_ratio(name="kl_cov_ratio", ratio=config.kl_cov_ratio)
    mask = inputs.response_mask
    log_ratio = clamped_log_ratio(log_prob=inputs.log_prob, old_log_prob=inputs.old_log_prob)
    policy_gradient = -inputs.advantages * log_ratio.exp()
    cov = token_covariance(advantages=inputs.advantages, log_prob=inputs.log_prob, response_mask=mask)
    penalised = top_covariance_tokens(cov=cov, valid=mask > 0, ratio=config.kl_cov_ratio)
    losses = torch.where(penalised, policy_gradient + config.ppo_kl_coef * log_ratio.abs(), policy_gradient)
    metrics = {
        **policy_loss_metrics(log_ratio=log_ratio, response_mask=mask, clipped=penalised),
        "ppo_kl_abs": masked_mean(values=log_ratio.detach().abs(), mask=mask).item(),
    }
    return agg(losses, inputs=inputs), metrics

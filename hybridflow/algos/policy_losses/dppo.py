"""DPPO: a trust region on the policy divergence, not on the ratio (``dppo_tv``, ``dppo_kl``).

"Rethinking the Trust Region in LLM Reinforcement Learning" (arXiv 2602.04879): PPO's
ratio clip is a poor proxy for a trust region on low-probability tokens. DPPO masks a
token's gradient when a binary divergence between pi_theta and pi_old *at the sampled
token* leaves the region in the direction the advantage pushes, with p = pi_theta(y_t),
q = pi_old(y_t), rho = p / q::

    dppo_tv:  D = p - q                                      out: A > 0 and D >  eps_high
                                                                  A <= 0 and D < -eps_low
    dppo_kl:  D = q log(q/p) + (1-q) log((1-q+1e-8)/(1-p+1e-8))
                                                             out: A > 0 and p > q and D > eps_high
                                                                  A <= 0 and p < q and D > eps_low
    l_t  = -A_t sg(min(rho_t, c)) log pi_theta(y_t) * keep_t      [B, T]
    loss = agg(l)

so the gradient is the (truncated-IS, Sec. 5.4) policy gradient ``-A min(rho, c) grad log p``
inside the region and 0 outside. ``eps`` are ``clip_ratio`` / ``clip_ratio_low`` /
``clip_ratio_high`` read as divergence thresholds (not ratio bounds), ``c`` is
``clip_ratio_c`` (the paper recommends a large one; verl passes the actor's, default 3).
Metrics: ``pg_clipfrac`` = fraction of tokens outside the region, ``pg_clipfrac_lower`` =
fraction inside it whose ratio was truncated at ``c``.
"""

from __future__ import annotations

from typing import Callable

import torch

from hybridflow.algos.policy_losses.common import (
    LossAggregation,
    PolicyLossInputs,
    clamped_log_ratio,
    policy_loss_metrics,
)
from hybridflow.algos.policy_losses.vanilla import VanillaConfig
from hybridflow.algos.registry import register_policy_loss

# 1e-8 inside the binary KL's second log, as verl: keeps log finite when p or q is 1.
_BINARY_KL_EPS = 1e-8


def tv_trust_region(*, prob, old_prob, advantages, low: float, high: float) -> torch.Tensor:
    """``[B, T]`` bool: the token stays inside the binary-TV region in the advantage's direction."""
    gap = prob - old_prob
    return torch.where(advantages > 0, gap <= high, gap >= -low)


def binary_kl(*, prob: torch.Tensor, old_prob: torch.Tensor) -> torch.Tensor:
    """KL(Bernoulli(q) || Bernoulli(p)) per token, with q = pi_old(y_t), p = pi_theta(y_t)."""
    return (old_prob * (old_prob.log() - prob.log())
            + (1 - old_prob) * torch.log((1 - old_prob + _BINARY_KL_EPS) / (1 - prob + _BINARY_KL_EPS)))


def kl_trust_region(*, prob, old_prob, advantages, low: float, high: float) -> torch.Tensor:
    """``[B, T]`` bool: inside the binary-KL region, or moving against the advantage's push."""
    divergence = binary_kl(prob=prob, old_prob=old_prob)
    keep_positive = (divergence <= high) | (prob <= old_prob)
    keep_negative = (divergence <= low) | (prob >= old_prob)
    return torch.where(advantages > 0, keep_positive, keep_negative)


def _dppo_loss(region: Callable[..., torch.Tensor]):
    def loss_fn(inputs: PolicyLossInputs, config: VanillaConfig,
                agg: LossAggregation) -> tuple[torch.Tensor, dict[str, float]]:
        low, high = config.bounds()
        log_prob, advantages = inputs.log_prob, inputs.advantages
        log_ratio = clamped_log_ratio(log_prob=log_prob, old_log_prob=inputs.old_log_prob)
        ratio = log_ratio.exp().detach()
        with torch.no_grad():
            keep = region(prob=log_prob.exp(), old_prob=inputs.old_log_prob.exp(), advantages=advantages, low=low,
                          high=high)
        losses = -advantages * ratio.clamp(max=config.clip_ratio_c) * log_prob * keep.to(log_prob.dtype)
        metrics = policy_loss_metrics(log_ratio=log_ratio, response_mask=inputs.response_mask, clipped=~keep,
                                      clipped_lower=keep & (ratio > config.clip_ratio_c))
        return agg(losses, inputs=inputs), metrics

    loss_fn.__doc__ = f"DPPO loss with the {region.__name__} mask over ``[B, T]`` inputs; see the module docstring."
    return loss_fn


dppo_tv_policy_loss = register_policy_loss("dppo_tv", config=VanillaConfig)(_dppo_loss(tv_trust_region))
dppo_kl_policy_loss = register_policy_loss("dppo_kl", config=VanillaConfig)(_dppo_loss(kl_trust_region))

"""Clip-Cov (``loss_mode=clip_cov``): cut the gradient of a few high-covariance tokens.

Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models" (arXiv 2505.22617): among valid tokens that PPO's ratio clip left
alone and whose covariance (covariance.py) lies in (``clip_cov_lb``, ``clip_cov_ub``),
pick ``max(1, floor(clip_cov_ratio * N))`` at random and drop their loss::

    l_t  = c_t * max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high)),
    c_t  = 0 for the picked tokens, 1 otherwise
    loss = agg(l)

``pg_clipfrac`` is the fraction of picked tokens (as in verl). Pass a seeded
``generator`` for reproducible picks.
"""

from __future__ import annotations

import torch

from hybridflow.algos.agg import agg_loss
from hybridflow.algos.policy_losses.common import (
    clamped_log_ratio,
    clip_range,
    clipped_surrogate,
    policy_loss_metrics,
    select_valid,
    weight_by_rollout_is,
)
from hybridflow.algos.policy_losses.covariance import check_token_ratio, covariance_token_count, token_covariance
from hybridflow.algos.registry import register_policy_loss


def pick_at_random(*, candidates: torch.Tensor, count: int, generator: torch.Generator | None) -> torch.Tensor:
    """A bool mask ``[B, T]`` with ``min(count, candidates.sum())`` random candidates set."""
    keys = torch.rand(candidates.shape, generator=generator, device=candidates.device)
    keys = keys.masked_fill(~candidates, -1.0)
    chosen = torch.zeros(candidates.numel(), dtype=torch.bool, device=candidates.device)
    num_chosen = min(count, int(candidates.sum()))
    chosen[keys.flatten().topk(num_chosen).indices] = True
    return chosen.view_as(candidates)


@register_policy_loss("clip_cov")
def clip_cov_policy_loss(
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    generator: torch.Generator | None = None,
    global_num_tokens: float | None = None,
    global_num_seqs: float | None = None,
    max_response_length: int | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    **_,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-Cov loss over ``[B, T]`` inputs; see the module docstring."""
    log_prob, old_log_prob = select_valid(log_prob=log_prob, old_log_prob=old_log_prob, response_mask=response_mask)
    check_token_ratio(name="clip_cov_ratio", ratio=clip_cov_ratio)
    low, high = clip_range(clip_ratio=clip_ratio, clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high)
    log_ratio = clamped_log_ratio(log_prob=log_prob, old_log_prob=old_log_prob)
    clip_loss, clipped = clipped_surrogate(ratio=log_ratio.exp(), advantages=advantages, clip_low=low, clip_high=high)
    valid = response_mask > 0
    cov = token_covariance(advantages=advantages, log_prob=log_prob, response_mask=response_mask)
    candidates = valid & ~clipped & (cov > clip_cov_lb) & (cov < clip_cov_ub)
    count = covariance_token_count(ratio=clip_cov_ratio, num_valid=int(valid.sum()))
    picked = pick_at_random(candidates=candidates, count=count, generator=generator)
    losses = clip_loss.masked_fill(picked, 0.0)
    loss = agg_loss(
        loss_mat=weight_by_rollout_is(losses=losses, rollout_is_weights=rollout_is_weights),
        loss_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        max_response_length=max_response_length,
    )
    metrics = policy_loss_metrics(log_ratio=log_ratio, response_mask=response_mask, clipped=picked)
    return loss, metrics

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

from dataclasses import dataclass

import torch

from hybridflow.algos.policy_losses.common import (
    ClipConfig,
    LossAggregation,
    PolicyLossInputs,
    clamped_log_ratio,
    clipped_surrogate,
    policy_loss_metrics,
)
from hybridflow.algos.policy_losses.covariance import check_token_ratio, covariance_token_count, token_covariance
from hybridflow.algos.registry import register_policy_loss

@dataclass(frozen=True)
class ClipCovConfig(ClipConfig):
    """The ratio clip, the share of tokens cut and the covariance window they are picked from."""

    clip_cov_ratio: float = 2e-4
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    generator: torch.Generator | None = None
    """Seeds the random pick (not a config key: tests pass one for reproducible picks)."""


def pick_at_random(*, candidates: torch.Tensor, count: int, generator: torch.Generator | None) -> torch.Tensor:
    """A bool mask ``[B, T]`` with ``min(count, candidates.sum())`` random candidates set."""
    keys = torch.rand(candidates.shape, generator=generator, device=candidates.device)
    keys = keys.masked_fill(~candidates, -1.0)
    chosen = torch.zeros(candidates.numel(), dtype=torch.bool, device=candidates.device)
    num_chosen = min(count, int(candidates.sum()))
    chosen[keys.flatten().topk(num_chosen).indices] = True
    return chosen.view_as(candidates)


@register_policy_loss("clip_cov", config=ClipCovConfig,
                      knobs={"clip_cov_ratio": "actor_rollout_ref.actor.policy_loss.clip_cov_ratio",
                             "clip_cov_lb": "actor_rollout_ref.actor.policy_loss.clip_cov_lb",
                             "clip_cov_ub": "actor_rollout_ref.actor.policy_loss.clip_cov_ub"})
def clip_cov_policy_loss(inputs: PolicyLossInputs, config: ClipCovConfig,
                         agg: LossAggregation) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-Cov loss over ``[B, T]`` inputs; see the module docstring."""
    check_token_ratio(name="clip_cov_ratio", ratio=config.clip_cov_ratio)
    low, high = config.bounds()
    advantages, mask = inputs.advantages, inputs.response_mask
    log_ratio = clamped_log_ratio(log_prob=inputs.log_prob, old_log_prob=inputs.old_log_prob)
    clip_loss, clipped = clipped_surrogate(ratio=log_ratio.exp(), advantages=advantages, clip_low=low, clip_high=high)
    valid = mask > 0
    cov = token_covariance(advantages=advantages, log_prob=inputs.log_prob, response_mask=mask)
    candidates = valid & ~clipped & (cov > config.clip_cov_lb) & (cov < config.clip_cov_ub)
    count = covariance_token_count(ratio=config.clip_cov_ratio, num_valid=int(valid.sum()))
    picked = pick_at_random(candidates=candidates, count=count, generator=config.generator)
    losses = clip_loss.masked_fill(picked, 0.0)
    metrics = policy_loss_metrics(log_ratio=log_ratio, response_mask=mask, clipped=picked)
    return agg(losses, inputs=inputs), metrics

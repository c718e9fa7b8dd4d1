"""Generalised advantage estimation (``adv_estimator=gae``, PPO with a critic).

Schulman et al., "High-Dimensional Continuous Control Using Generalized Advantage
Estimation" (arXiv 1506.02438), eq. 16, over the valid response tokens::

    delta_t = r_t + gamma * V_{t+1} - V_t
    A_t     = delta_t + gamma * lam * A_{t+1}
    R_t     = A_t + V_t                          (the critic's regression target)

"t+1" is the next *valid* token: masked tokens inside a response (tool observations in
multi-turn rollouts) are skipped and carry V and A through unchanged, and after the last
valid token V = A = 0. The advantages are then whitened over the batch's valid tokens
(as in verl and OpenAI's lm-human-preferences); returns are not.
"""

from __future__ import annotations

import torch

from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.registry import register_advantage
from hybridflow.algos.stats import masked_whiten


@register_advantage("gae", needs_values=True)
@torch.no_grad()
def gae_advantage(
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    **_,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Whitened GAE advantages and returns, both ``[B, T]`` and 0 on masked tokens."""
    if values is None:
        raise AlgorithmError(
            "gae needs critic values; enable the critic or choose a critic-free adv_estimator (grpo, rloo, ...)"
        )
    valid = response_mask.bool()
    zeros = torch.zeros_like(values)
    # Padding is garbage by contract (NaN/inf values or rewards): select, never multiply,
    # so nothing from a masked position reaches any output.
    values = torch.where(valid, values, zeros)
    rewards = torch.where(valid, token_level_rewards.to(values.dtype), zeros)
    next_value = torch.zeros_like(values[:, 0])
    next_advantage = torch.zeros_like(values[:, 0])
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        # a masked token leaves the recursion state as it found it.
        next_value = torch.where(valid[:, t], values[:, t], next_value)
        next_advantage = torch.where(valid[:, t], advantage, next_advantage)
        advantages[:, t] = next_advantage
    returns = torch.where(valid, advantages + values, zeros)
    whitened = masked_whiten(values=advantages, mask=valid)
    return torch.where(valid, whitened, zeros), returns

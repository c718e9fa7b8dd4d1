"""ReMax advantages (``adv_estimator=remax``).

Li et al., "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method
for Aligning LLMs" (arXiv 2310.10505), Algorithm 1: the baseline is the reward of the
greedy response to the same prompt, b(x) = r(x, argmax-decoded y)::

    G_t = sum_{t' >= t} r_t'          (undiscounted return-to-go over valid tokens)
    A_t = G_t - b(x)

No whitening, as in the paper and verl.
"""

from __future__ import annotations

import torch

from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.registry import register_advantage


def return_to_go(*, token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Undiscounted sum of masked rewards from each token to the end, ``[B, T]``."""
    masked = token_level_rewards * response_mask.to(token_level_rewards.dtype)
    return masked.flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])


@register_advantage("remax", needs_greedy_baseline=True)
@torch.no_grad()
def remax_advantage(
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    reward_baselines: torch.Tensor | None = None,
    **_,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(G - b) * mask`` and ``G``, both ``[B, T]``; ``reward_baselines`` is ``[B]``."""
    if reward_baselines is None:
        raise AlgorithmError(
            "remax needs reward_baselines (the greedy response's reward per prompt); "
            "generate a greedy rollout and score it, or choose another adv_estimator"
        )
    returns = return_to_go(token_level_rewards=token_level_rewards, response_mask=response_mask)
    mask = response_mask.to(returns.dtype)
    advantages = (returns - reward_baselines.to(returns.dtype)[:, None]) * mask
    return advantages, returns

"""REINFORCE++ advantages (``reinforce_plus_plus`` and ``reinforce_plus_plus_baseline``).

Hu, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models"
(arXiv 2501.03262)::

    reinforce_plus_plus:           G_t = sum_{t' >= t} gamma^(t'-t) r_t'   (valid tokens)
                                   A   = whiten_batch(G)
    reinforce_plus_plus_baseline:  A   = whiten_batch(r - mean_group(r))   (per token)

Whitening is over all valid tokens of the batch (the "global advantage
normalisation" that replaces GRPO's per-prompt std). A group of one has mean 0.
"""

from __future__ import annotations

import torch

from hybridflow.algos.advantages.groups import group_ids, group_mean_std
from hybridflow.algos.registry import register_advantage
from hybridflow.algos.stats import masked_whiten


def discounted_return_to_go(
    *, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float
) -> torch.Tensor:
    """G_t = r_t + gamma * G_{t+1}, restarted at 0 after every masked token, ``[B, T]``."""
    mask = response_mask.to(token_level_rewards.dtype)
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[1])):
        running = token_level_rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]
    return returns


@register_advantage("reinforce_plus_plus")
@torch.no_grad()
def reinforce_plus_plus_advantage(
    *, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float = 1.0, **_
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch-whitened discounted return ``[B, T]``, and the return itself."""
    returns = discounted_return_to_go(
        token_level_rewards=token_level_rewards, response_mask=response_mask, gamma=gamma
    )
    advantages = masked_whiten(values=returns, mask=response_mask) * response_mask.to(returns.dtype)
    return advantages, returns


@register_advantage("reinforce_plus_plus_baseline")
@torch.no_grad()
def reinforce_plus_plus_baseline_advantage(
    *, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index, **_
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-mean-centred outcome score, whitened over the batch's tokens, ``[B, T]``."""
    scores = token_level_rewards.sum(dim=-1)
    ids = group_ids(index=index, batch_size=len(scores), device=scores.device)
    mean, _, count = group_mean_std(scores=scores, ids=ids)
    centred = scores - torch.where(count > 1, mean, torch.zeros_like(mean))
    mask = response_mask.to(scores.dtype)
    advantages = masked_whiten(values=centred[:, None] * mask, mask=mask) * mask
    return advantages, advantages

"""REINFORCE++ advantages (``reinforce_plus_plus`` and ``reinforce_plus_plus_baseline``).

Hu, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models"
(arXiv 2501.03262)::

    reinforce_plus_plus:           G_t = r_t + gamma * G_{t'}    (t' the next *valid* token)
                                   A   = whiten_batch(G)
    reinforce_plus_plus_baseline:  A   = whiten_batch(r - mean_group(r))   (per token)

Whitening is over all valid tokens of the batch (the "global advantage
normalisation" that replaces GRPO's per-prompt std). A group of one has mean 0.

Masked tokens inside a response (tool observations of a multi-turn rollout) are
skipped: the return flows through them unchanged, so earlier turns are credited with
the final outcome (as GAE does, and verl). Their own return and advantage are 0, and a
reward placed on a masked token is ignored.
"""

from __future__ import annotations

import torch

from hybridflow.algos.advantages.groups import group_ids, group_mean_std
from hybridflow.algos.registry import register_advantage
from hybridflow.algos.stats import masked_whiten


def discounted_return_to_go(
    *, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float
) -> torch.Tensor:
    """G_t = r_t + gamma * G_{next valid token} on valid tokens, 0 on masked ones, ``[B, T]``.

    A masked token leaves the running return as it found it (``where``, not a product:
    a NaN reward in padding cannot leak into the valid tokens).
    """
    valid = response_mask.bool()
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[1])):
        running = torch.where(valid[:, t], token_level_rewards[:, t] + gamma * running, running)
        returns[:, t] = torch.where(valid[:, t], running, torch.zeros_like(running))
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

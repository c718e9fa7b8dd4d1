"""verl's ``*_vectorized`` estimator names (``grpo_vectorized``, ``rloo_vectorized``).

verl 0.9 ships loop-free twins of ``grpo`` and ``rloo`` under these names. Ours are
already vectorised, so ``grpo_vectorized`` is ``grpo`` itself. verl's ``rloo_vectorized``
differs from its ``rloo`` in one case, which we keep: a prompt with a single response
gets advantage 0 (``rloo`` gives it A = r).
"""

from __future__ import annotations

import torch

from hybridflow.algos.advantages.groups import group_ids, group_sum
from hybridflow.algos.advantages.grpo import grpo_advantage
from hybridflow.algos.advantages.rloo import rloo_advantage
from hybridflow.algos.registry import register_advantage

register_advantage("grpo_vectorized")(grpo_advantage)


@register_advantage("rloo_vectorized")
@torch.no_grad()
def rloo_vectorized_advantage(
    *, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index, **_
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rloo`` ``[B, T]``, but 0 for a prompt with a single response (as verl's rloo_vectorized)."""
    advantages, _ = rloo_advantage(token_level_rewards=token_level_rewards, response_mask=response_mask, index=index)
    ids = group_ids(index=index, batch_size=len(advantages), device=advantages.device)
    count = group_sum(values=torch.ones(len(advantages), device=advantages.device), ids=ids)
    advantages = torch.where((count > 1)[:, None], advantages, torch.zeros_like(advantages))
    return advantages, advantages

"""PRIME advantages (``adv_estimator=prime``; verl-recipe's ``recipe/prime`` with ``adv_estimator=rloo``).

RLOO per reward source, summed, returns whitened (the math: :func:`hybridflow.algos.prime.prime_advantages`): the
implicit PRM's dense rewards ``prm_rewards [B, T]`` weighted by ``reward_dpo_coef``, and the outcome (the sum of
``token_level_rewards``: the rule score, minus the KL penalty when ``use_kl_in_reward``) on the last response token
weighted by ``reward_gt_coef``. A prompt's ``n`` samples are consecutive rows sharing one ``index`` id.
"""

from __future__ import annotations

import torch

from hybridflow.algos.advantages.groups import group_ids
from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.prime import implicit_prm_problems, prime_advantages
from hybridflow.algos.registry import register_advantage


def consecutive_group_size(index, *, batch_size: int) -> int:
    """``n``: the size of every group, when the groups are equal runs of consecutive rows (else an error)."""
    ids = group_ids(index=index, batch_size=batch_size)
    num_groups = int(ids.max()) + 1
    n = batch_size // num_groups
    if n * num_groups != batch_size or not torch.equal(ids, torch.arange(num_groups).repeat_interleave(n)):
        raise AlgorithmError("prime: a prompt's samples must be consecutive rows, every prompt with the same number "
                             "(rollout.n); keep trainer.balance_batch=False, as the recipe does")
    return n


@register_advantage("prime", needs_implicit_prm=True, needs_reference=True,
                    knobs={"reward_dpo_coef": "algorithm.reward_dpo_coef",
                           "reward_gt_coef": "algorithm.reward_gt_coef"}, check=implicit_prm_problems)
@torch.no_grad()
def prime_advantage(*, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index,
                    prm_rewards: torch.Tensor | None = None, reward_dpo_coef: float = 5.0,
                    reward_gt_coef: float = 5.0, **_) -> tuple[torch.Tensor, torch.Tensor]:
    """Whitened advantages and returns ``[B, T]`` from the dense and the outcome rewards."""
    if prm_rewards is None:
        raise AlgorithmError("prime needs the implicit PRM's dense rewards (prm_rewards); run it through "
                             "python -m hybridflow.trainer.main_prime, which builds the PRM")
    n = consecutive_group_size(index, batch_size=len(token_level_rewards))
    return prime_advantages(dense_rewards=prm_rewards.float(), outcome_scores=token_level_rewards.sum(-1).float(),
                            response_mask=response_mask.float(), n=n, dense_coef=reward_dpo_coef,
                            outcome_coef=reward_gt_coef)

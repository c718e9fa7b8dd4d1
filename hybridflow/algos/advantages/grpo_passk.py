"""Pass@k advantages (``adv_estimator=grpo_passk``).

The pass@k objective (maximise the best of k samples, not their mean) in verl's
GRPO-style form: only the best response of each group is credited, by its margin over
the runner-up, which is the marginal gain of that sample to max_i r_i::

    A_best = (r_max - r_second) [/ (std(r) + eps)],   A_other = 0

The std division follows ``norm_adv_by_std_in_grpo``. Ties go to the first sample (and
give A = 0 anyway). Every group needs at least two samples.
"""

from __future__ import annotations

import torch

from hybridflow.algos.advantages.groups import group_ids, group_mean_std
from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.registry import register_advantage


def _best_and_runner_up(*, scores: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample ``[B]``: is it its group's (first) best, and the group's second score."""
    num_groups = int(ids.max()) + 1
    positions = torch.arange(len(scores), device=scores.device)
    group_max = torch.full((num_groups,), -torch.inf, dtype=scores.dtype, device=scores.device)
    group_max = group_max.scatter_reduce(0, ids, scores, reduce="amax")[ids]
    first_best = torch.full((num_groups,), len(scores), device=scores.device)
    best_positions = positions.masked_fill(scores < group_max, len(scores))
    first_best = first_best.scatter_reduce(0, ids, best_positions, reduce="amin")
    is_best = positions == first_best[ids]
    rest = scores.masked_fill(is_best, -torch.inf)
    runner_up = torch.full((num_groups,), -torch.inf, dtype=scores.dtype, device=scores.device)
    return is_best, runner_up.scatter_reduce(0, ids, rest, reduce="amax")[ids]


@register_advantage("grpo_passk")
@torch.no_grad()
def grpo_passk_advantage(
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
    **_,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Best-of-group margin on the best sample's tokens ``[B, T]``, 0 elsewhere."""
    scores = token_level_rewards.sum(dim=-1)
    ids = group_ids(index=index, batch_size=len(scores), device=scores.device)
    _, std, count = group_mean_std(scores=scores, ids=ids)
    if bool((count < 2).any()):
        raise AlgorithmError("grpo_passk needs at least 2 responses per prompt; set actor_rollout_ref.rollout.n >= 2")
    is_best, runner_up = _best_and_runner_up(scores=scores, ids=ids)
    margin = torch.where(is_best, scores - runner_up, torch.zeros_like(scores))
    if norm_adv_by_std_in_grpo:
        margin = margin / (std + epsilon)
    advantages = margin[:, None] * response_mask.to(scores.dtype)
    return advantages, advantages

"""Preference labels from scored samples: SPIN's chosen/rejected pairs, SPPO's win rates.

Both read the scores ``[B]`` of ``n`` responses per prompt laid out as groups of ``n``
consecutive rows (the rollout's order), so group ``g`` is rows ``g*n .. g*n+n-1``.

==================  =============================================================  ==========
function            what it returns                                                paper
==================  =============================================================  ==========
best_worst_pairs    per group with distinct scores: (argmax row, argmin row)       2401.01335
group_win_rates     P(y_i > pi | x) ~ 1/n sum_j [1(s_i > s_j) + 1/2 1(s_i = s_j)]  2405.00675
==================  =============================================================  ==========

The win rate is SPPO's estimate of ``P(y > pi_t | x)`` (Wu et al. 2024, Algorithm 1:
the average over the K samples of the pairwise preference, each sample's comparison
with itself counting 1/2) with the preference oracle ``P(y > y') = 1(s > s') + 1/2 1(s = s')``
given by a rule or reward-model score.
"""

from __future__ import annotations

import torch

from hybridflow.algos.errors import AlgorithmError


def _groups(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    if scores.dim() != 1 or group_size < 1 or scores.numel() % group_size:
        raise AlgorithmError(f"scores of shape {tuple(scores.shape)} do not split into groups of {group_size}")
    return scores.reshape(-1, group_size)


def best_worst_pairs(*, scores: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row indices ``(chosen [P], rejected [P])``: the best and the worst response of each group.

    Online DPO with rule ranking (verl's ``compute_onlinedpo_pref`` for n = 2, generalised to
    best-vs-worst for n > 2). Groups whose responses all score the same carry no preference
    and give no pair; among equal best (worst) scores the first row is taken.
    """
    if group_size < 2:
        raise AlgorithmError(f"pairs need at least 2 responses per prompt, got rollout.n={group_size}")
    groups = _groups(scores, group_size)
    best, worst = groups.argmax(dim=1), groups.argmin(dim=1)
    distinct = (groups.max(dim=1).values > groups.min(dim=1).values).nonzero().flatten()
    offsets = distinct * group_size
    return offsets + best[distinct], offsets + worst[distinct]


def group_win_rates(*, scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[B]`` estimated probability that each response beats the policy on its prompt (SPPO)."""
    groups = _groups(scores, group_size).float()
    mine, theirs = groups.unsqueeze(2), groups.unsqueeze(1)  # [G, n, 1] against [G, 1, n]
    wins = (mine > theirs).float() + 0.5 * (mine == theirs).float()
    return wins.mean(dim=2).reshape(-1)

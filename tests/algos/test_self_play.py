"""Pair construction (SPIN / online DPO) and win-rate estimation (SPPO), by hand."""

import pytest
import torch

from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.self_play import best_worst_pairs, group_win_rates


def test_best_worst_pairs_by_hand():
    # three groups of n = 3 rows: [0.2, 0.9, 0.5] -> (1, 0); [1, 1, 1] -> tie, no pair; [0, 1, 1] -> (7, 6)
    scores = torch.tensor([0.2, 0.9, 0.5, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0])
    chosen, rejected = best_worst_pairs(scores=scores, group_size=3)
    assert chosen.tolist() == [1, 7]  # among equal best scores the first row
    assert rejected.tolist() == [0, 6]


def test_pairs_of_two_match_verls_argmax_rule():
    # verl's compute_onlinedpo_pref for n = 2: the argmax of each pair is chosen
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0])
    chosen, rejected = best_worst_pairs(scores=scores, group_size=2)
    assert chosen.tolist() == [0, 3] and rejected.tolist() == [1, 2]


def test_pairs_need_two_responses_and_whole_groups():
    with pytest.raises(AlgorithmError, match="rollout.n=1"):
        best_worst_pairs(scores=torch.zeros(4), group_size=1)
    with pytest.raises(AlgorithmError, match="groups of 3"):
        best_worst_pairs(scores=torch.zeros(4), group_size=3)


def test_win_rates_by_hand():
    # group [3, 1, 1, 0]: y0 beats all (1 + 1 + 1 + 1/2 self) / 4 = 0.875
    # y1: beats y3, ties y2 and itself: (1 + 0.5 + 0.5) / 4 = 0.5 ; y2 the same; y3: only itself 0.5 / 4
    scores = torch.tensor([3.0, 1.0, 1.0, 0.0, 2.0, 2.0, 2.0, 2.0])
    rates = group_win_rates(scores=scores, group_size=4)
    assert rates.tolist() == pytest.approx([0.875, 0.5, 0.5, 0.125, 0.5, 0.5, 0.5, 0.5])


def test_win_rates_average_one_half_per_group():
    """Invariance: sum_i P(y_i > pi) = n/2 (every comparison gives 1 to one side, or 1/2 to each)."""
    gen = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 4, (40,), generator=gen).float()
    rates = group_win_rates(scores=scores, group_size=8).reshape(5, 8)
    assert rates.mean(dim=1).tolist() == pytest.approx([0.5] * 5)
    # and only the order of the scores matters
    assert torch.equal(group_win_rates(scores=scores * 10 - 3, group_size=8).reshape(5, 8), rates)

"""remax and reinforce_plus_plus: return-to-go estimators."""

import math

import pytest
import torch

from hybridflow.algos import AlgorithmError, get_advantage

REWARDS = torch.tensor([[1.0, 0.0, 2.0, 7.0], [0.0, 3.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])


def test_remax_subtracts_the_greedy_baseline_from_return_to_go():
    baselines = torch.tensor([0.5, 1.0, 4.0])
    adv, ret = get_advantage("remax")(token_level_rewards=REWARDS, response_mask=MASK, reward_baselines=baselines)
    # masked reward 7.0 is ignored
    torch.testing.assert_close(ret, torch.tensor([[3.0, 2.0, 2.0, 0.0], [3.0, 3.0, 0.0, 0.0], [0.0] * 4]))
    torch.testing.assert_close(adv, torch.tensor([[2.5, 1.5, 1.5, 0.0], [2.0, 2.0, 0.0, 0.0], [0.0] * 4]))


def test_remax_without_baselines_names_the_fix():
    with pytest.raises(AlgorithmError, match="greedy"):
        get_advantage("remax")(token_level_rewards=REWARDS, response_mask=MASK)


def test_reinforce_pp_discounts_and_whitens_over_valid_tokens():
    gamma = 0.5
    adv, ret = get_advantage("reinforce_plus_plus")(token_level_rewards=REWARDS, response_mask=MASK, gamma=gamma)
    row0 = [1 + gamma * 0 + gamma**2 * 2, 0 + gamma * 2, 2.0]
    row1 = [gamma * 3, 3.0]
    torch.testing.assert_close(ret[0, :3], torch.tensor(row0))
    torch.testing.assert_close(ret[1, :2], torch.tensor(row1))
    tokens = row0 + row1
    mean = sum(tokens) / 5
    std = math.sqrt(sum((x - mean) ** 2 for x in tokens) / 4 + 1e-8)
    white0, white1 = [(x - mean) / std for x in row0], [(x - mean) / std for x in row1]
    expected = torch.tensor([[*white0, 0.0], [*white1, 0.0, 0.0], [0.0] * 4])
    torch.testing.assert_close(adv, expected)


def test_reinforce_pp_length_one_responses_are_finite():
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    mask = torch.tensor([[1, 0], [1, 0]])
    adv, ret = get_advantage("reinforce_plus_plus")(token_level_rewards=rewards, response_mask=mask)
    assert torch.isfinite(adv).all()
    assert adv[0, 0] > 0 > adv[1, 0]


def test_reinforce_pp_carries_the_return_across_a_masked_span_issue_13():
    """Issue 13's reproduction: the observation token (mask 0) passes the final reward back to turn 1."""
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 0, 1], [1, 1, 1]])
    adv, ret = get_advantage("reinforce_plus_plus")(token_level_rewards=rewards, response_mask=mask, gamma=1.0)
    torch.testing.assert_close(ret, torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]))
    # whitened over the 5 valid returns [1, 1, 0, 0, 0]: mean 0.4, unbiased var 0.3
    high, low = 0.6 / math.sqrt(0.3 + 1e-8), -0.4 / math.sqrt(0.3 + 1e-8)
    torch.testing.assert_close(adv, torch.tensor([[high, 0.0, high], [low, low, low]]))
    assert high == pytest.approx(1.0954, abs=1e-4) and low == pytest.approx(-0.7303, abs=1e-4)


def test_reinforce_pp_discounts_over_valid_tokens_only_and_ignores_padding_garbage():
    """Multi-turn: turn 1 (t0, t1), observation (t2, t3), turn 2 (t4); gamma counts model tokens only."""
    gamma = 0.5
    rewards = torch.tensor([[0.0, 0.0, 9.0, float("nan"), 2.0, float("nan")]])
    mask = torch.tensor([[1, 1, 0, 0, 1, 0]])
    _, ret = get_advantage("reinforce_plus_plus")(token_level_rewards=rewards, response_mask=mask, gamma=gamma)
    torch.testing.assert_close(ret, torch.tensor([[gamma**2 * 2, gamma * 2, 0.0, 0.0, 2.0, 0.0]]))

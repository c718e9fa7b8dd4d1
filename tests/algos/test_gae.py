import math

import pytest
import torch

from hybridflow.algos import AlgorithmError, get_advantage

gae = get_advantage("gae")


def _whiten(xs):
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    return [(x - mean) / math.sqrt(var + 1e-8) for x in xs]


def _gae_over_valid_tokens(rewards, values, gamma, lam):
    """Schulman eq. 16 on the list of valid tokens of one response (V and A are 0 after the end)."""
    advantages, next_value, next_adv = [0.0] * len(rewards), 0.0, 0.0
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * next_value - values[t]
        next_adv = delta + gamma * lam * next_adv
        next_value = values[t]
        advantages[t] = next_adv
    return advantages


def test_matches_hand_recursion_with_padding_and_a_masked_observation_token():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 0.5, 0.0, 2.0]])
    values = torch.tensor([[0.1, 0.2, 0.3, 9.0], [0.4, 7.0, 0.6, 0.7]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 1]])  # row1 token 1: tool observation
    adv, ret = gae(token_level_rewards=rewards, response_mask=mask, values=values, gamma=0.9, lam=0.8)
    row0 = _gae_over_valid_tokens([0.0, 0.0, 1.0], [0.1, 0.2, 0.3], 0.9, 0.8)
    row1 = _gae_over_valid_tokens([0.0, 0.0, 2.0], [0.4, 0.6, 0.7], 0.9, 0.8)
    expected_returns = torch.tensor(
        [[row0[0] + 0.1, row0[1] + 0.2, row0[2] + 0.3, 0.0], [row1[0] + 0.4, 0.0, row1[1] + 0.6, row1[2] + 0.7]]
    )
    torch.testing.assert_close(ret, expected_returns)
    whitened = _whiten(row0 + row1)
    expected = torch.tensor([[*whitened[:3], 0.0], [whitened[3], 0.0, *whitened[4:]]])
    torch.testing.assert_close(adv, expected)


def test_gamma_lam_one_gives_monte_carlo_return_minus_value():
    rewards = torch.tensor([[1.0, 2.0, 3.0]])
    values = torch.tensor([[0.5, 0.25, 0.125]])
    _, ret = gae(token_level_rewards=rewards, response_mask=torch.ones(1, 3), values=values)
    torch.testing.assert_close(ret, torch.tensor([[6.0, 5.0, 3.0]]))


def test_lam_zero_is_one_step_td():
    rewards = torch.tensor([[0.0, 1.0]])
    values = torch.tensor([[0.5, 0.25]])
    _, ret = gae(token_level_rewards=rewards, response_mask=torch.ones(1, 2), values=values, gamma=0.5, lam=0.0)
    # A0 = 0 + 0.5 * 0.25 - 0.5, A1 = 1 - 0.25 ; returns = A + V
    torch.testing.assert_close(ret, torch.tensor([[0.5 * 0.25, 1.0]]))


def test_edge_cases_all_masked_row_and_length_one():
    rewards = torch.tensor([[0.0, 0.0], [3.0, 0.0], [0.0, 1.0]])
    values = torch.tensor([[1.0, 1.0], [1.0, 5.0], [0.0, 0.0]])
    mask = torch.tensor([[0, 0], [1, 0], [1, 1]])
    adv, ret = gae(token_level_rewards=rewards, response_mask=mask, values=values, gamma=1.0, lam=1.0)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert adv[0].abs().sum() == 0 and ret[0].abs().sum() == 0
    assert ret[1, 0].item() == pytest.approx(3.0)


def test_missing_values_names_the_fix():
    with pytest.raises(AlgorithmError, match="critic"):
        gae(token_level_rewards=torch.zeros(1, 2), response_mask=torch.ones(1, 2))


def test_nan_values_under_the_mask_do_not_leak_issue_13():
    """Issue 13's reproduction: padding values are NaN; returns and advantages stay finite, 0 there."""
    values = torch.tensor([[0.2, 0.4, float("nan")], [0.1, 0.3, float("nan")]])
    rewards = torch.tensor([[0.0, 1.0, float("nan")], [0.0, 0.5, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    adv, ret = gae(token_level_rewards=rewards, response_mask=mask, values=values, gamma=1.0, lam=1.0)
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 0.0], [0.5, 0.5, 0.0]]))
    # A = R - V = [0.8, 0.6, 0.4, 0.2]: mean 0.5, unbiased var 0.2 / 3
    scale = math.sqrt(0.2 / 3 + 1e-8)
    expected = torch.tensor([[0.3 / scale, 0.1 / scale, 0.0], [-0.1 / scale, -0.3 / scale, 0.0]])
    torch.testing.assert_close(adv, expected)


def test_nan_inside_an_observation_span_does_not_leak():
    values = torch.tensor([[0.5, float("nan"), float("inf"), 0.25]])
    rewards = torch.tensor([[0.0, float("nan"), 3.0, 1.0]])
    mask = torch.tensor([[1, 0, 0, 1]])
    _, ret = gae(token_level_rewards=rewards, response_mask=mask, values=values, gamma=1.0, lam=1.0)
    torch.testing.assert_close(ret, torch.tensor([[1.0, 0.0, 0.0, 1.0]]))  # the observation's reward is ignored

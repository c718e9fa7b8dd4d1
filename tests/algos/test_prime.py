"""PRIME's implicit PRM math (hybridflow.algos.prime) against hand-computed values of arXiv 2502.01456 Sec. 3."""

import math

import pytest
import torch

from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.prime import implicit_prm_ce_loss, implicit_process_rewards, leave_one_out, prime_advantages

MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])


def test_dense_rewards_are_beta_times_the_log_ratio_on_response_tokens():
    prm = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -0.5]])
    ref = torch.tensor([[-1.5, -1.0, -9.0], [-0.5, -1.5, 0.5]])
    rewards = implicit_process_rewards(prm_log_probs=prm, ref_log_probs=ref, response_mask=MASK, beta=0.5)
    # r_t = 0.5 * (log pi_phi - log pi_ref): 0.5*0.5, 0.5*(-1), masked; 0, 0.5*1, 0.5*(-1)
    assert rewards.tolist() == [[0.25, -0.5, 0.0], [0.0, 0.5, -0.5]]


def test_ce_loss_by_hand():
    # q sums: 0.5 - 0.1 = 0.4 (third token masked) and 0.2 + 0.2 - 1.0 = -0.6; beta 0.5 -> logits 0.2, -0.3
    q = torch.tensor([[0.5, -0.1, 7.0], [0.2, 0.2, -1.0]])
    loss = implicit_prm_ce_loss(log_ratios=q, response_mask=MASK, outcome=torch.tensor([1.0, 0.0]), beta=0.5)
    # -(log sigma(0.2) + log(1 - sigma(-0.3))) / 2 = -(log sigma(0.2) + log sigma(0.3)) / 2
    sigma = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    expected = -(math.log(sigma(0.2)) + math.log(sigma(0.3))) / 2  # = (0.598139 + 0.554355) / 2 = 0.576247
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert expected == pytest.approx(0.576247, abs=1e-6)


def test_leave_one_out_of_an_outcome_is_r_minus_the_others_mean():
    outcome = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.5], [0.0, 1.0]])
    last = torch.tensor([[False, True]] * 4)
    got = leave_one_out(rewards=outcome, reward_mask=last, n=4)
    # r_i - mean of the other three: 1 - 1.5/3, 0 - 2.5/3, 0.5 - 2/3, 1 - 1.5/3
    assert got[:, 1].tolist() == pytest.approx([0.5, -2.5 / 3, 0.5 - 2 / 3, 0.5])
    assert got[:, 0].tolist() == [0.0] * 4
    with pytest.raises(AlgorithmError, match="n >= 2"):
        leave_one_out(rewards=outcome, reward_mask=last, n=1)


def test_prime_advantages_by_hand():
    dense = torch.tensor([[0.2, 0.4, 9.0], [0.1, -0.1, 0.3]])
    advantages, returns = prime_advantages(dense_rewards=dense, outcome_scores=torch.tensor([1.0, 0.0]),
                                           response_mask=MASK, n=2, dense_coef=1.0, outcome_coef=1.0)
    # dense RLOO: m = 0.3, 0.1; r * 2 - 0.4 -> [0.0, 0.4], [-0.2, -0.6, 0.2]
    # outcome RLOO on the last tokens (index 1, index 2): 2 * 1 - 1 = 1, 2 * 0 - 1 = -1
    # total [0.0, 1.4, 0], [-0.2, -0.6, -0.8]; returns (reverse cumsum) [1.4, 1.4, 0], [-1.6, -1.4, -0.8]
    torch.testing.assert_close(returns, torch.tensor([[1.4, 1.4, 0.0], [-1.6, -1.4, -0.8]]))
    # whiten over the 5 response tokens: mean -0.2, unbiased variance (2.56 + 2.56 + 1.96 + 1.44 + 0.36) / 4 = 2.22
    scale = 1 / math.sqrt(2.22 + 1e-8)
    expected = [[1.6 * scale, 1.6 * scale], [-1.4 * scale, -1.2 * scale, -0.6 * scale]]
    assert advantages[0, :2].tolist() == pytest.approx(expected[0], abs=1e-6)
    assert advantages[1].tolist() == pytest.approx(expected[1], abs=1e-6)

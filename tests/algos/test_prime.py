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


# ------------------------------------------------------------------ granularity, batch norm, the registered estimator
def test_whole_granularity_puts_the_sum_on_the_last_response_token():
    from hybridflow.algos.prime import dense_reward_granularity

    rewards = torch.tensor([[0.25, -0.5, 0.0], [0.0, 0.5, -0.5]])
    whole = dense_reward_granularity(rewards, response_mask=MASK, granularity="whole")
    assert whole.tolist() == [[0.0, -0.25, 0.0], [0.0, 0.0, 0.0]]
    assert dense_reward_granularity(rewards, response_mask=MASK, granularity="token") is rewards
    with pytest.raises(AlgorithmError, match="prime_granularity='step'.*token, whole"):
        dense_reward_granularity(rewards, response_mask=MASK, granularity="step")


def test_batch_norm_divides_by_the_largest_reverse_cumsum():
    from hybridflow.algos.prime import prime_batch_norm

    rewards = torch.tensor([[1.0, 1.0, 0.0], [-3.0, 0.5, 0.5]])
    # reverse cumsums: [2, 1, 0], [-2, 1, 0.5]; max |.| = 2
    torch.testing.assert_close(prime_batch_norm(rewards, norm="batch_norm"),
                               torch.tensor([[0.5, 0.5, 0.0], [-1.5, 0.25, 0.25]]), atol=1e-6, rtol=0)
    assert prime_batch_norm(rewards, norm="none") is rewards
    with pytest.raises(AlgorithmError, match="prime_norm='l2'"):
        prime_batch_norm(rewards, norm="l2")


def test_registered_prime_estimator_is_the_recipe_math_with_the_outcome_from_token_level_rewards():
    from hybridflow.algos import advantage_spec, get_advantage

    assert advantage_spec("prime").needs_implicit_prm and not advantage_spec("rloo").needs_implicit_prm
    dense = torch.tensor([[0.2, 0.4, 9.0], [0.1, -0.1, 0.3]])
    scores = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])  # the score on the last response token
    got, returns = get_advantage("prime")(token_level_rewards=scores, response_mask=MASK, index=["a", "a"],
                                          prm_rewards=dense, reward_dpo_coef=1.0, reward_gt_coef=1.0)
    # the hand-computed returns of test_prime_advantages_by_hand
    torch.testing.assert_close(returns, torch.tensor([[1.4, 1.4, 0.0], [-1.6, -1.4, -0.8]]))
    # dense coefficient 0: only the outcome's RLOO, +1 / -1 on every token before each last one, x reward_gt_coef
    _, outcome_only = get_advantage("prime")(token_level_rewards=scores, response_mask=MASK, index=["a", "a"],
                                             prm_rewards=dense, reward_dpo_coef=0.0, reward_gt_coef=5.0)
    torch.testing.assert_close(outcome_only, torch.tensor([[5.0, 5.0, 0.0], [-5.0, -5.0, -5.0]]))


def test_prime_estimator_refuses_missing_dense_rewards_and_interleaved_groups():
    from hybridflow.algos import get_advantage

    scores = torch.zeros(4, 3)
    mask = torch.ones(4, 3)
    with pytest.raises(AlgorithmError, match="main_prime"):
        get_advantage("prime")(token_level_rewards=scores, response_mask=mask, index=[0, 0, 1, 1])
    with pytest.raises(AlgorithmError, match="consecutive rows"):
        get_advantage("prime")(token_level_rewards=scores, response_mask=mask, index=[0, 1, 0, 1],
                               prm_rewards=scores)


def test_dpo_accuracy_by_hand():
    from hybridflow.algos.prime import dpo_accuracy

    mask = torch.ones(6, 1)
    # prompt 1: sums [3, 2, 1], outcomes [1, 0, 0.5]: pairs (0,1) agree w 1, (0,2) agree w 0.5, (1,2) disagree w 0.5
    # -> 1.5 / 2 = 0.75; prompt 2: all outcomes equal -> 0.5; mean 0.625
    rewards = torch.tensor([[3.0], [2.0], [1.0], [-1.0], [1.0], [0.0]])
    outcome = torch.tensor([1.0, 0.0, 0.5, 1.0, 1.0, 1.0])
    got = dpo_accuracy(rewards=rewards, outcome=outcome, response_mask=mask, n=3)
    assert got["reward_model/dpo_acc"] == pytest.approx(0.625)
    # sign(sum) == sign(2y - 1): row 0 (+,+), row 4 (+,+) agree; row 1 (+,-), row 2 (+,0), row 3 (-,+), row 5 (0,+) not
    assert got["reward_model/dpo_acc_abs"] == pytest.approx(2 / 6)


def test_the_prime_estimator_s_spec_checks_the_implicit_prm_settings():
    from hybridflow.algos import advantage_spec

    recipe = {"reward_model.model.update": "before", "reward_model.model.loss_type": "ce",
              "reward_model.prime_granularity": "token", "reward_model.prime_norm": "batch_norm",
              "reward_model.model.path": None, "actor_rollout_ref.model.path": "/m", "actor_rollout_ref.rollout.n": 4,
              "trainer.nnodes": 1, "trainer.n_gpus_per_node": 2, "trainer.balance_batch": True,
              "trainer.backend": "ray"}
    check = advantage_spec("prime").check
    assert check(lambda key: {**recipe, "trainer.balance_batch": False}[key]) == []
    bad = {**recipe, "reward_model.model.update": "after", "reward_model.model.path": "/other",
           "actor_rollout_ref.rollout.n": 1}
    assert [line.split(":")[0].split(" ")[0] for line in check(bad.__getitem__)] == [
        "reward_model.model.update='after'", "reward_model.model.path='/other'", "PRIME's",
        "PRIME"]  # n >= 2 for leave-one-out; balancing over 2 Ray ranks breaks consecutive rows

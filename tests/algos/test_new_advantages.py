"""verl 0.9's newer estimators: gdpo, optimal token baselines, the *_vectorized names (hand-computed)."""

import math

import numpy as np
import pytest
import torch

from hybridflow.algos import AlgorithmError, get_advantage
from hybridflow.algos.logprob import sum_pi_squared_from_logits

# four responses, two prompts; row 1 is multi-turn (t1 is a tool observation), rows 2/3 differ in length
MASK = torch.tensor([[1, 1, 0], [1, 0, 1], [1, 1, 1], [1, 0, 0]])
INDEX = np.array(["a", "a", "b", "b"])


def test_gdpo_normalises_each_component_in_its_group_then_whitens_the_weighted_sum():
    """GDPO (arXiv 2601.05242): A^k by GRPO per component, sum_k w_k A^k, whitened over valid tokens."""
    components = {"format": torch.tensor([1.0, 0.0, 1.0, 1.0]), "accuracy": torch.tensor([2.0, 4.0, 0.0, 0.0])}
    adv, ret = get_advantage("gdpo")(token_level_rewards=torch.zeros(4, 3), response_mask=MASK, index=INDEX,
                                     reward_components=components, reward_weights=[1.0, 0.5])
    # group a: format [1, 0] -> +-1/sqrt(2); accuracy [2, 4] -> -+1/sqrt(2); group b: constant -> 0
    combined = 1 / math.sqrt(2) - 0.5 / math.sqrt(2)
    # 8 valid tokens: 2 x +c, 2 x -c, 4 x 0 -> mean 0, unbiased var 4 c^2 / 7
    white = combined / math.sqrt(4 * combined**2 / 7 + 1e-8)
    expected = torch.tensor([[white, white, 0.0], [-white, 0.0, -white], [0.0] * 3, [0.0] * 3])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ret, adv)


def test_gdpo_with_one_component_is_grpo_then_batch_whitening():
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 3.0], [1.0, 0.0, 0.0]])
    gdpo, _ = get_advantage("gdpo")(token_level_rewards=rewards, response_mask=MASK, index=INDEX)
    grpo, _ = get_advantage("grpo")(token_level_rewards=rewards, response_mask=MASK, index=INDEX)
    valid = grpo[MASK.bool()]
    torch.testing.assert_close(gdpo[MASK.bool()], (valid - valid.mean()) / torch.sqrt(valid.var() + 1e-8))


def test_gdpo_weights_must_match_components():
    with pytest.raises(AlgorithmError, match="gdpo_reward_weights"):
        get_advantage("gdpo")(token_level_rewards=torch.zeros(4, 3), response_mask=MASK, index=INDEX,
                              reward_components={"a": torch.zeros(4)}, reward_weights=[1.0, 2.0])


def _otb(name, *, rewards, mask, pi, sum_pi_squared=0.5, index=("g", "g"), weights=None):
    return get_advantage(name)(token_level_rewards=rewards, response_mask=mask, index=np.array(index),
                               old_log_probs=torch.log(pi), sum_pi_squared=torch.full_like(pi, sum_pi_squared),
                               rollout_is_weights=weights)


def test_optimal_token_baseline_weights_each_step_by_cumulative_path_variance():
    """w = 1 - 2 pi + sum pi^2: row 0 (pi 0.5) 0.5 per token, row 1 (pi 0.25) 1.0 per token."""
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    pi = torch.tensor([[0.5, 0.5, 0.5], [0.25, 0.25, 0.25]])
    adv, ret = _otb("optimal_token_baseline", rewards=rewards, mask=mask, pi=pi)
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    # t0: W = (0.5, 1) -> B = 0.5 / 1.5; t1: W = (1, 2) -> B = 1 / 3; t2: row 0 is the unique longest
    # response past the runner-up's length 2 -> B = 0 there
    third = 1 / 3
    torch.testing.assert_close(adv, torch.tensor([[1 - third, 1 - third, 1.0], [-third, -third, 0.0]]))


def test_rollout_is_weights_scale_the_path_variance_squared():
    rewards = torch.tensor([[1.0], [0.0]])
    mask = torch.ones(2, 1)
    pi = torch.full((2, 1), 0.5)
    adv, _ = _otb("optimal_token_baseline", rewards=rewards, mask=mask, pi=pi, weights=torch.tensor([[2.0], [1.0]]))
    # W = 0.5 * rho^2 = (2, 0.5): B = 2 / 2.5
    torch.testing.assert_close(adv, torch.tensor([[1 - 0.8], [-0.8]]))


MULTI_TURN = torch.tensor([[1, 0, 0, 1, 1], [1, 1, 1, 0, 0]])  # row 0: turn, 2 observation tokens, turn
MT_REWARDS = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0]])


def test_tir_optimal_token_baseline_aligns_the_kth_own_token_across_responses():
    adv, ret = _otb("tir_optimal_token_baseline", rewards=MT_REWARDS, mask=MULTI_TURN, pi=torch.full((2, 5), 0.5))
    # both responses have 3 own tokens with equal W: B_k = (1 + 0) / 2 at every k
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.0, 0.0, 0.5, 0.5], [-0.5, -0.5, -0.5, 0.0, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 0.0, 0.0, 1.0, 1.0], [0.0] * 5]))


def test_optimal_token_baseline_aligns_by_position_on_the_same_multi_turn_batch():
    adv, _ = _otb("optimal_token_baseline", rewards=MT_REWARDS, mask=MULTI_TURN, pi=torch.full((2, 5), 0.5))
    # t0: both valid -> B = 0.5; t1, t2: only row 1 valid (return 0) -> B = 0; t3, t4: only row 0 -> B = G = 1
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.0, 0.0, 0.0, 0.0], [-0.5, 0.0, 0.0, 0.0, 0.0]]))


def test_optimal_token_baselines_singletons_keep_the_return_and_padding_garbage_stays_out():
    rewards = torch.tensor([[0.0, 2.0, float("nan")]])
    mask = torch.tensor([[1, 1, 0]])
    pi = torch.tensor([[0.5, 0.5, float("nan")]])
    for name in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        adv, _ = _otb(name, rewards=rewards, mask=mask, pi=pi, index=("solo",))
        torch.testing.assert_close(adv, torch.tensor([[2.0, 2.0, 0.0]]))


def test_optimal_token_baselines_name_the_switch_they_need():
    with pytest.raises(AlgorithmError, match="calculate_sum_pi_squared=True"):
        get_advantage("optimal_token_baseline")(token_level_rewards=MT_REWARDS, response_mask=MULTI_TURN,
                                                index=np.array(["a", "a"]))


def test_sum_pi_squared_from_logits_is_the_collision_probability():
    logits = torch.tensor([[0.0, math.log(3.0)], [5.0, 5.0]])  # probabilities (1/4, 3/4) and (1/2, 1/2)
    torch.testing.assert_close(sum_pi_squared_from_logits(logits=logits), torch.tensor([0.625, 0.5]))


def test_grpo_vectorized_is_grpo_and_rloo_vectorized_zeroes_singletons():
    rewards = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 5.0], [0.0, 0.0, 0.0]])
    index = np.array(["a", "a", "solo", "b"])
    for name in ("grpo", "rloo"):
        base, _ = get_advantage(name)(token_level_rewards=rewards, response_mask=MASK, index=index)
        vectorized, _ = get_advantage(f"{name}_vectorized")(token_level_rewards=rewards, response_mask=MASK,
                                                            index=index)
        if name == "rloo":  # verl's rloo gives a singleton A = r, its rloo_vectorized A = 0
            assert base[2].abs().sum() > 0 and vectorized[2:].abs().sum() == 0
            base[2:] = 0
        torch.testing.assert_close(vectorized, base)
    rloo, _ = get_advantage("rloo_vectorized")(token_level_rewards=rewards, response_mask=MASK, index=index)
    torch.testing.assert_close(rloo[:2], torch.tensor([[1.0, 1.0, 0.0], [-1.0, 0.0, -1.0]]))  # r_i - r_j

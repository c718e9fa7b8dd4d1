"""grpo, rloo, opo, gpg, grpo_passk, reinforce_plus_plus_baseline: group-relative estimators."""

import math
import statistics

import numpy as np
import pytest
import torch

from hybridflow.algos import AlgorithmError, get_advantage

EPS = 1e-6


def _outcome_batch(scores, lengths, width=4):
    """Scores on the last valid token, as the reward manager places them."""
    rewards = torch.zeros(len(scores), width)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).float()
    for i, (score, length) in enumerate(zip(scores, lengths)):
        if length:
            rewards[i, length - 1] = score
    return rewards, mask


SCORES = [1.0, 0.0, 0.0, 1.0, 5.0, 2.0, 2.0]
LENGTHS = [2, 4, 1, 3, 2, 4, 3]
INDEX = ["a", "a", "a", "a", "b", "c", "c"]  # b: a group of one; c: identical rewards


def _per_sample(adv):
    return [adv[i, : LENGTHS[i]].tolist() for i in range(len(LENGTHS))]


def _check_broadcast(adv, mask, expected):
    for i, value in enumerate(expected):
        assert adv[i, : LENGTHS[i]].tolist() == pytest.approx([value] * LENGTHS[i], abs=1e-5), i
    assert adv[mask == 0].abs().sum() == 0


@pytest.mark.parametrize("index", [INDEX, np.array(INDEX, dtype=object), [10, 10, 10, 10, 20, 30, 30]])
def test_grpo_normalises_by_unbiased_group_std(index):
    rewards, mask = _outcome_batch(SCORES, LENGTHS)
    adv, ret = get_advantage("grpo")(token_level_rewards=rewards, response_mask=mask, index=index)
    group_a = SCORES[:4]
    mean_a, std_a = statistics.mean(group_a), statistics.stdev(group_a)
    expected = [(s - mean_a) / (std_a + EPS) for s in group_a] + [5.0 / (1 + EPS), 0.0, 0.0]
    _check_broadcast(adv, mask, expected)
    assert torch.equal(adv, ret)


def test_dr_grpo_does_not_divide_by_std():
    rewards, mask = _outcome_batch(SCORES, LENGTHS)
    adv, _ = get_advantage("grpo")(
        token_level_rewards=rewards, response_mask=mask, index=INDEX, norm_adv_by_std_in_grpo=False
    )
    _check_broadcast(adv, mask, [0.5, -0.5, -0.5, 0.5, 5.0, 0.0, 0.0])


def test_identical_non_round_rewards_give_exactly_zero_advantage():
    # 0.1 * 3 / 3 != 0.1 in floating point; a naive mean would leave ~1e-8 / 1e-6 = 0.01 advantages
    rewards, mask = _outcome_batch([0.1, 0.1, 0.1, 0.7, 0.7], [1, 2, 3, 1, 1])
    for name in ("grpo", "rloo", "opo", "gpg", "reinforce_plus_plus_baseline"):
        adv, _ = get_advantage(name)(token_level_rewards=rewards, response_mask=mask, index=[0, 0, 0, 1, 1])
        assert torch.equal(adv, torch.zeros_like(adv)), name


def test_rloo_baseline_is_mean_of_the_others():
    rewards, mask = _outcome_batch(SCORES, LENGTHS)
    adv, _ = get_advantage("rloo")(token_level_rewards=rewards, response_mask=mask, index=INDEX)
    group_a = SCORES[:4]
    expected = [s - (sum(group_a) - s) / 3 for s in group_a] + [5.0, 0.0, 0.0]
    _check_broadcast(adv, mask, expected)
    # the n/(n-1) form of the same estimator
    assert expected[0] == pytest.approx(4 / 3 * (1.0 - statistics.mean(group_a)))


def test_opo_baseline_is_length_weighted():
    rewards, mask = _outcome_batch(SCORES, LENGTHS)
    adv, _ = get_advantage("opo")(token_level_rewards=rewards, response_mask=mask, index=INDEX)
    baseline_a = (2 * 1.0 + 4 * 0.0 + 1 * 0.0 + 3 * 1.0) / (2 + 4 + 1 + 3)
    _check_broadcast(adv, mask, [s - baseline_a for s in SCORES[:4]] + [5.0, 0.0, 0.0])


def test_gpg_scales_by_batch_over_nonzero_scores():
    rewards, mask = _outcome_batch(SCORES, LENGTHS)
    adv, _ = get_advantage("gpg")(token_level_rewards=rewards, response_mask=mask, index=INDEX)
    alpha = 7 / 5  # five non-zero scores
    _check_broadcast(adv, mask, [alpha * (s - 0.5) for s in SCORES[:4]] + [alpha * 5.0, 0.0, 0.0])


def test_gpg_all_zero_scores_give_zero_not_nan():
    rewards, mask = _outcome_batch([0.0, 0.0], [1, 2])
    adv, _ = get_advantage("gpg")(token_level_rewards=rewards, response_mask=mask, index=[0, 0])
    assert torch.equal(adv, torch.zeros_like(adv))


def test_grpo_passk_credits_only_the_best_sample_by_its_margin():
    scores = [0.2, 0.9, 0.5, 0.9, 1.0, 3.0]
    lengths = [1, 2, 3, 4, 2, 1]
    rewards, mask = _outcome_batch(scores, lengths)
    index = [0, 0, 0, 0, 1, 1]
    adv, _ = get_advantage("grpo_passk")(
        token_level_rewards=rewards, response_mask=mask, index=index, norm_adv_by_std_in_grpo=False
    )
    # group 0: tie at 0.9 -> first best (sample 1) gets 0.9 - 0.9 = 0; group 1: sample 5 gets 2.0
    expected = [0.0, 0.0, 0.0, 0.0, 0.0, 2.0]
    for i, value in enumerate(expected):
        assert adv[i, : lengths[i]].tolist() == pytest.approx([value] * lengths[i])
    normed, _ = get_advantage("grpo_passk")(token_level_rewards=rewards, response_mask=mask, index=index)
    assert normed[5, 0].item() == pytest.approx(2.0 / (statistics.stdev([1.0, 3.0]) + EPS))


def test_grpo_passk_group_of_one_is_an_error():
    rewards, mask = _outcome_batch([1.0, 0.0, 1.0], [1, 1, 1])
    with pytest.raises(AlgorithmError, match="rollout.n >= 2"):
        get_advantage("grpo_passk")(token_level_rewards=rewards, response_mask=mask, index=[0, 0, 1])


def test_reinforce_pp_baseline_centres_then_whitens_over_tokens():
    rewards, mask = _outcome_batch(SCORES, LENGTHS)
    adv, _ = get_advantage("reinforce_plus_plus_baseline")(token_level_rewards=rewards, response_mask=mask, index=INDEX)
    centred = [s - 0.5 for s in SCORES[:4]] + [5.0, 0.0, 0.0]
    tokens = [c for c, n in zip(centred, LENGTHS) for _ in range(n)]
    mean = sum(tokens) / len(tokens)
    std = math.sqrt(sum((x - mean) ** 2 for x in tokens) / (len(tokens) - 1) + 1e-8)
    _check_broadcast(adv, mask, [(c - mean) / std for c in centred])


def test_index_length_must_match_the_batch():
    rewards, mask = _outcome_batch([1.0, 0.0], [1, 1])
    with pytest.raises(AlgorithmError, match="one group id"):
        get_advantage("grpo")(token_level_rewards=rewards, response_mask=mask, index=[0])


def test_group_estimators_are_invariant_to_shuffling_the_batch():
    rewards, mask = _outcome_batch(SCORES, LENGTHS)
    perm = torch.tensor([6, 2, 4, 0, 5, 1, 3])
    for name in ("grpo", "rloo", "opo", "gpg", "reinforce_plus_plus_baseline"):
        adv, _ = get_advantage(name)(token_level_rewards=rewards, response_mask=mask, index=INDEX)
        shuffled, _ = get_advantage(name)(
            token_level_rewards=rewards[perm], response_mask=mask[perm], index=[INDEX[i] for i in perm]
        )
        torch.testing.assert_close(shuffled, adv[perm], msg=name)


def test_group_ids_accept_tensors_numpy_and_strings_by_value():
    from hybridflow.algos.advantages.groups import group_ids

    expected = [0, 1, 0, 2]
    indexes = (torch.tensor([7, 3, 7, 9]), np.array([7, 3, 7, 9]), ["u7", "u3", "u7", "u9"], np.array(["a", "b", "a", "c"]))
    for index in indexes:
        assert group_ids(index=index, batch_size=4).tolist() == expected

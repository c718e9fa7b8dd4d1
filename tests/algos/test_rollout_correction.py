"""Rollout correction: IS weights (token / sequence, TIS / IcePop), rejection, metrics (hand-computed)."""

import math

import pytest
import torch

from hybridflow.algos import AlgorithmError
from hybridflow.algos.rollout_correction import rollout_correction

LN = math.log
NAN = float("nan")
# row 0: turn (t0, t1), tool observation (t2), turn (t3); row 1: two tokens then padding with garbage log-probs
MASK = torch.tensor([[1, 1, 0, 1], [1, 1, 0, 0]])
ROLLOUT = torch.tensor([[-1.0, -2.0, -5.0, -1.0], [-0.5, -1.0, NAN, NAN]])
RATIOS = torch.tensor([[3.0, 0.5, 1.0, 1.2], [1.0, 0.8, 1.0, 1.0]])  # pi_train / pi_rollout on valid tokens
TRAIN = torch.where(MASK.bool(), ROLLOUT + RATIOS.log(), torch.tensor(NAN))


def _correct(**kwargs):
    return rollout_correction(train_log_prob=TRAIN, rollout_log_prob=ROLLOUT, response_mask=MASK, **kwargs)


def test_token_is_truncates_at_the_threshold_and_is_zero_off_the_mask():
    weights, mask, metrics = _correct(rollout_is="token", rollout_is_threshold=2.0)
    torch.testing.assert_close(weights, torch.tensor([[2.0, 0.5, 0.0, 1.2], [1.0, 0.8, 0.0, 0.0]]))
    assert torch.equal(mask, MASK)  # no rejection asked for
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx((2 + 0.5 + 1.2 + 1 + 0.8) / 5)
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 5)  # raw 3 > 2
    assert metrics["rollout_corr/rollout_is_ratio_fraction_low"] == pytest.approx(0.0)  # none < 1/2
    applied = [2.0, 0.5, 1.2, 1.0, 0.8]
    mean = sum(applied) / 5
    ess = 1 / (sum((w / (mean + 1e-8)) ** 2 for w in applied) / 5)
    assert metrics["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(ess, rel=1e-5)


def test_sequence_is_is_the_product_over_the_valid_tokens():
    weights, _, metrics = _correct(rollout_is="sequence", rollout_is_threshold=2.0)
    row0, row1 = 3.0 * 0.5 * 1.2, 1.0 * 0.8  # 1.8 and 0.8: the observation's ratio is not in the product
    torch.testing.assert_close(weights, torch.tensor([[row0, row0, 0.0, row0], [row1, row1, 0.0, 0.0]]))
    assert metrics["rollout_corr/rollout_is_seq_mean"] == pytest.approx((row0 + row1) / 2)


def test_icepop_zeroes_weights_outside_the_band():
    weights, _, metrics = _correct(rollout_is="token", rollout_is_threshold="0.6_2.0")
    torch.testing.assert_close(weights, torch.tensor([[0.0, 0.0, 0.0, 1.2], [1.0, 0.8, 0.0, 0.0]]))
    assert metrics["rollout_corr/rollout_is_oob_ratio"] == pytest.approx(2 / 5)


def test_batch_normalisation_divides_by_the_mean_and_reports_it():
    weights, _, metrics = _correct(rollout_is="token", rollout_is_threshold=2.0, rollout_is_batch_normalize=True)
    mean = (2 + 0.5 + 1.2 + 1 + 0.8) / 5
    torch.testing.assert_close(weights, torch.tensor([[2.0, 0.5, 0.0, 1.2], [1.0, 0.8, 0.0, 0.0]]) / mean)
    assert metrics["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(mean)
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(mean)  # statistics before normalising


def test_token_k1_rejects_tokens_whose_ratio_leaves_the_bounds():
    """k1 = log(pi_rollout / pi_train) (verl's sign): bounds on 1/rho = (1/3, 2, 0.83, 1, 1.25)."""
    weights, mask, metrics = _correct(rollout_rs="token_k1", rollout_rs_threshold="0.6_1.9")
    assert weights is None
    torch.testing.assert_close(mask, torch.tensor([[0, 0, 0, 1], [1, 1, 0, 0]]))
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 5)
    assert metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(1 / 2)


def test_sequence_options_reject_whole_sequences_and_all_options_must_pass():
    # seq_mean_k3 of row 0: mean over t0, t1, t3 of rho - 1 - log rho; of row 1: over t0, t1
    k3 = lambda r: r - 1 - LN(r)  # noqa: E731
    row0, row1 = (k3(3.0) + k3(0.5) + k3(1.2)) / 3, (k3(1.0) + k3(0.8)) / 2
    assert row1 < 0.05 < row0
    _, mask, metrics = _correct(rollout_rs="seq_mean_k3", rollout_rs_threshold=0.05)
    torch.testing.assert_close(mask, torch.tensor([[0, 0, 0, 0], [1, 1, 0, 0]]))
    assert metrics["rollout_corr/rollout_rs_seq_mean_k3_seq_mean"] == pytest.approx((row0 + row1) / 2, rel=1e-5)
    assert metrics["rollout_corr/rollout_rs_seq_mean_k3_fraction_high"] == pytest.approx(1 / 2)  # per sequence
    # seq_sum_k1 = sum of log(pi_rollout / pi_train): row 1 -> -log 0.8 = 0.223 > log 1.2 -> rejected too
    _, mask, _ = _correct(rollout_rs="seq_max_k2,seq_sum_k1", rollout_rs_threshold="1.0,0.5_1.2")
    torch.testing.assert_close(mask, torch.tensor([[1, 1, 0, 1], [0, 0, 0, 0]]))


def test_off_policy_metrics_by_hand():
    _, _, metrics = _correct()
    log_ratios = [LN(3.0), LN(0.5), LN(1.2), 0.0, LN(0.8)]
    assert metrics["rollout_corr/kl"] == pytest.approx(-sum(log_ratios) / 5, rel=1e-5)
    assert metrics["rollout_corr/chi2_token"] == pytest.approx((9 + 0.25 + 1.44 + 1 + 0.64) / 5 - 1, rel=1e-5)
    assert metrics["rollout_corr/chi2_seq"] == pytest.approx((1.8**2 + 0.8**2) / 2 - 1, rel=1e-5)
    assert metrics["rollout_corr/rollout_ppl"] == pytest.approx((math.exp(4 / 3) + math.exp(0.75)) / 2, rel=1e-5)
    assert all(math.isfinite(value) for value in metrics.values())


@pytest.mark.parametrize("kwargs, message", [
    (dict(rollout_is="tokens"), "token, sequence or null"),
    (dict(rollout_is="token", rollout_is_threshold="2_1"), "lower bound"),
    (dict(rollout_is="token", rollout_is_threshold="abc"), "not a number"),
    (dict(rollout_rs="token_k4", rollout_rs_threshold=1.0), "token_k1"),
    (dict(rollout_rs="token_k2"), "rollout_rs_threshold"),
    (dict(rollout_rs="token_k1", rollout_rs_threshold=0.5), "U must be >= 1"),
    (dict(rollout_rs="token_k2", rollout_rs_threshold="0.1_0.2"), "single upper bound"),
    (dict(rollout_rs="token_k2,token_k3", rollout_rs_threshold="1,2,3"), "one per option"),
])
def test_bad_settings_name_the_fix(kwargs, message):
    with pytest.raises(AlgorithmError, match=message):
        _correct(**kwargs)

import math

import pytest
import torch

from hybridflow.algos import (
    AdaptiveKLController,
    AlgorithmError,
    FixedKLController,
    UnknownAlgorithmError,
    apply_kl_penalty,
    kl_penalty,
)

LOGP = torch.tensor([-1.0, -2.0, -0.5])
REF = torch.tensor([-1.5, -1.0, -0.5])
D = [0.5, -1.0, 0.0]  # logp - ref


@pytest.mark.parametrize(
    "names, formula",
    [
        (("kl", "k1"), lambda d: d),
        (("abs",), lambda d: abs(d)),
        (("mse", "k2"), lambda d: 0.5 * d * d),
        (("low_var_kl", "k3"), lambda d: math.exp(-d) + d - 1),
    ],
)
def test_estimators_match_schulman_formulas(names, formula):
    for name in names:
        expected = torch.tensor([formula(d) for d in D])
        torch.testing.assert_close(kl_penalty(logprob=LOGP, ref_logprob=REF, kl_penalty=name), expected)


def test_k3_is_clamped_for_huge_log_ratios():
    logp = torch.tensor([0.0, 0.0, 0.0])
    ref = torch.tensor([-1000.0, 1000.0, 5.0])
    k3 = kl_penalty(logprob=logp, ref_logprob=ref, kl_penalty="k3")
    assert torch.isfinite(k3).all()
    # d = 1000: exp(-20) + 20 - 1 > 10 -> clamped to 10; d = -1000: exp(20) ... -> 10; d = -5: e^5 - 5 - 1
    torch.testing.assert_close(k3, torch.tensor([10.0, 10.0, 10.0]))
    unclamped = kl_penalty(logprob=torch.tensor([0.0]), ref_logprob=torch.tensor([1.0]), kl_penalty="k3")
    assert unclamped.item() == pytest.approx(math.e - 1 - 1)  # d = -1: e^1 - 1 - 1


@pytest.mark.parametrize("name, value", [("k3+", lambda d: math.exp(-d) + d - 1), ("k1+", lambda d: d)])
def test_straight_through_has_the_value_of_its_base_and_the_gradient_of_k2(name, value):
    logp = LOGP.clone().requires_grad_(True)
    estimate = kl_penalty(logprob=logp, ref_logprob=REF, kl_penalty=name)
    torch.testing.assert_close(estimate.detach(), torch.tensor([value(d) for d in D]))
    (grad,) = torch.autograd.grad(estimate.sum(), logp)
    torch.testing.assert_close(grad, torch.tensor(D))  # d/dlogp of d^2/2 = d


def test_unknown_kl_type_lists_choices():
    with pytest.raises(UnknownAlgorithmError, match="low_var_kl"):
        kl_penalty(logprob=LOGP, ref_logprob=REF, kl_penalty="k4")


def test_fixed_controller_never_moves():
    ctrl = FixedKLController(kl_coef=0.05)
    ctrl.update(current_kl=100.0, n_steps=64)
    assert ctrl.value == 0.05


def test_adaptive_controller_proportional_error_is_clipped_to_02():
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.5, horizon=1000)
    ctrl.update(current_kl=0.6, n_steps=100)  # error 0.2 exactly
    assert ctrl.value == pytest.approx(0.1 * (1 + 0.2 * 100 / 1000))
    ctrl.update(current_kl=50.0, n_steps=100)  # error 99 -> clipped to 0.2
    assert ctrl.value == pytest.approx(0.1 * 1.02 * 1.02)
    ctrl.update(current_kl=0.0, n_steps=500)  # error -1 -> clipped to -0.2
    assert ctrl.value == pytest.approx(0.1 * 1.02 * 1.02 * 0.9)
    ctrl.update(current_kl=0.45, n_steps=1000)  # error -0.1, not clipped
    assert ctrl.value == pytest.approx(0.1 * 1.02 * 1.02 * 0.9 * 0.9)


def test_adaptive_controller_rejects_nonpositive_target():
    with pytest.raises(AlgorithmError, match="target_kl"):
        AdaptiveKLController(init_kl_coef=0.1, target_kl=0.0, horizon=10)


def test_apply_kl_penalty_charges_every_valid_token():
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    old = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -9.0]])
    ref = torch.tensor([[-1.5, -2.0, -2.0], [-0.5, -1.25, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    rewards, current_kl = apply_kl_penalty(
        token_level_scores=scores, old_log_prob=old, ref_log_prob=ref, response_mask=mask, kl_coef=0.1
    )
    kld = [[0.5, 0.0, -1.0], [-0.5, 0.25, 0.0]]  # k1, masked token -> 0
    expected = torch.tensor([[s - 0.1 * k for s, k in zip(srow, krow)] for srow, krow in zip(scores.tolist(), kld)])
    torch.testing.assert_close(rewards, expected)
    assert current_kl == pytest.approx(((0.5 - 1.0) / 3 + (-0.5 + 0.25) / 2) / 2)


def test_abs_plus_issue_13_example():
    """Issue 13: log-prob [[-1, -2]], ref [[-1.5, -1]], abs+ -> value [[0.5, 1.0]], gradient [[0.5, -1.0]]."""
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    estimate = kl_penalty(logprob=logp, ref_logprob=torch.tensor([[-1.5, -1.0]]), kl_penalty="abs+")
    torch.testing.assert_close(estimate.detach(), torch.tensor([[0.5, 1.0]]))
    (grad,) = torch.autograd.grad(estimate.sum(), logp)
    torch.testing.assert_close(grad, torch.tensor([[0.5, -1.0]]))


@pytest.mark.parametrize("base", ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"])
def test_every_estimator_has_a_plus_form_with_its_value_and_the_k2_gradient(base):
    logp = LOGP.clone().requires_grad_(True)
    plus = kl_penalty(logprob=logp, ref_logprob=REF, kl_penalty=base + "+")
    torch.testing.assert_close(plus.detach(), kl_penalty(logprob=LOGP, ref_logprob=REF, kl_penalty=base))
    (grad,) = torch.autograd.grad(plus.sum(), logp)
    torch.testing.assert_close(grad, torch.tensor(D))

"""verl 0.9's newer policy losses: sapo, geo_mean, dppo_tv, dppo_kl, dro, bypass_mode (hand-computed)."""

import math

import pytest
import torch

from hybridflow.algos import AlgorithmError, get_policy_loss

LN = math.log


def _grad(loss, log_prob):
    (grad,) = torch.autograd.grad(loss, log_prob)
    return grad


def test_sapo_gate_has_slope_one_at_ratio_one_and_a_sign_dependent_temperature():
    """SAPO (arXiv 2511.20347): l = -sigma(tau (rho - 1)) 4 / tau * A, seq-mean-token-mean."""
    old = torch.tensor([[-1.0, -1.0, -2.0]])
    log_prob = (old + torch.tensor([[0.0, 0.5, 9.0]])).requires_grad_(True)
    advantages = torch.tensor([[1.0, -1.0, 5.0]])
    mask = torch.tensor([[1, 1, 0]])  # t2: padding with an absurd ratio
    loss, metrics = get_policy_loss("sapo")(old_log_prob=old, log_prob=log_prob, advantages=advantages,
                                            response_mask=mask, tau_pos=1.0, tau_neg=1.05, loss_agg_mode="token-sum")
    sigmoid = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    token0 = -sigmoid(0.0) * 4 / 1.0 * 1.0  # = -2
    token1 = sigmoid(1.05 * (math.exp(0.5) - 1)) * 4 / 1.05
    assert loss.item() == pytest.approx((token0 + token1) / 2)  # one sequence of 2 tokens, whatever loss_agg_mode
    s1 = sigmoid(1.05 * (math.exp(0.5) - 1))
    expected_grad = [-1.0 * 1.0 / 2, 1.0 * s1 * (1 - s1) * 4 * math.exp(0.5) / 2, 0.0]  # -A f'(rho) rho / 2
    torch.testing.assert_close(_grad(loss, log_prob), torch.tensor([expected_grad]))
    assert metrics["pg_clipfrac"] == 0.0 and metrics["ppo_kl"] == pytest.approx(-0.25)


def test_sapo_rejects_non_positive_temperatures():
    with pytest.raises(AlgorithmError, match="tau_pos"):
        get_policy_loss("sapo")(old_log_prob=torch.zeros(1, 1), log_prob=torch.zeros(1, 1),
                                advantages=torch.ones(1, 1), response_mask=torch.ones(1, 1), tau_pos=0.0)


def test_geo_mean_clips_log_ratios_pessimistically_and_averages_geometrically():
    """GMPO (arXiv 2507.20673): s_i = exp(mean_t clipped log rho), l_i = -A_i s_i, mean over sequences."""
    old = torch.zeros(3, 3)
    log_prob = torch.tensor([[0.1, 0.5, 7.0], [-0.5, 0.3, 0.0], [0.0, 0.0, 0.0]]).requires_grad_(True)
    advantages = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0], [2.0, 2.0, 2.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [0, 0, 0]])  # row 2: empty (not counted)
    loss, metrics = get_policy_loss("geo_mean")(old_log_prob=old, log_prob=log_prob, advantages=advantages,
                                                response_mask=mask, clip_ratio=0.2)
    # A > 0: min(lr, clip(lr)) = (0.1, 0.2); A < 0: max(lr, clip(lr)) = (-0.2, 0.3)
    assert loss.item() == pytest.approx((-math.exp(0.15) + math.exp(0.05)) / 2)
    expected_grad = [[-math.exp(0.15) / 2 / 2, 0.0, 0.0], [0.0, math.exp(0.05) / 2 / 2, 0.0], [0.0] * 3]
    torch.testing.assert_close(_grad(loss, log_prob), torch.tensor(expected_grad))
    # row 0: 0.5 left the range (A > 0); row 1: both -0.5 and 0.3 did (A < 0)
    assert metrics["pg_clipfrac"] == pytest.approx(1 / 4) and metrics["pg_clipfrac_lower"] == pytest.approx(2 / 4)


def test_geo_mean_is_invariant_to_splitting_rows_with_global_sequence_count():
    old, log_prob = torch.zeros(2, 2), torch.tensor([[0.1, -0.1], [0.3, 0.0]])
    advantages, mask = torch.tensor([[1.0, 1.0], [-2.0, -2.0]]), torch.ones(2, 2)
    fn = get_policy_loss("geo_mean")
    whole, _ = fn(old_log_prob=old, log_prob=log_prob, advantages=advantages, response_mask=mask)
    parts = [fn(old_log_prob=old[i:i + 1], log_prob=log_prob[i:i + 1], advantages=advantages[i:i + 1],
                response_mask=mask[i:i + 1], global_num_seqs=2)[0] for i in range(2)]
    assert sum(parts).item() == pytest.approx(whole.item())


# DPPO tokens (q = pi_old, p = pi_theta): A>0 p .5->.8 (TV .3, out) | A>0 .5->.6 (in) |
# A<0 .5->.2 (TV -.3, out) | A<0 .5->.8 (moves against A's push: TV in the other direction, in)
DPPO_OLD = torch.log(torch.tensor([[0.5, 0.5, 0.5, 0.5]]))
DPPO_NEW = [[0.8, 0.6, 0.2, 0.8]]
DPPO_ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0]])


@pytest.mark.parametrize("name, kept", [("dppo_tv", [0, 1, 0, 1]), ("dppo_kl", [0, 1, 0, 1])])
def test_dppo_masks_tokens_outside_the_divergence_trust_region(name, kept):
    """DPPO (arXiv 2602.04879): l = -A sg(min(rho, c)) log p on kept tokens. Binary KL of (.5 -> .8) and
    (.5 -> .2) is 0.2231 > 0.2, of (.5 -> .6) 0.0204; binary TV is |p - q|."""
    log_prob = torch.log(torch.tensor(DPPO_NEW)).requires_grad_(True)
    loss, metrics = get_policy_loss(name)(old_log_prob=DPPO_OLD, log_prob=log_prob, advantages=DPPO_ADV,
                                          response_mask=torch.ones(1, 4), clip_ratio=0.2, clip_ratio_c=3.0,
                                          loss_agg_mode="token-sum")
    ratios = [p / 0.5 for p in DPPO_NEW[0]]
    per_token = [-a * r * LN(p) * k for a, r, p, k in zip(DPPO_ADV[0].tolist(), ratios, DPPO_NEW[0], kept)]
    assert loss.item() == pytest.approx(sum(per_token))
    expected_grad = [-a * r * k for a, r, k in zip(DPPO_ADV[0].tolist(), ratios, kept)]
    torch.testing.assert_close(_grad(loss, log_prob), torch.tensor([expected_grad]))
    assert metrics["pg_clipfrac"] == pytest.approx(2 / 4)


def test_dppo_kl_keeps_what_tv_masks_when_the_kl_is_small_and_truncates_the_ratio_at_c():
    """q = .05 -> p = .28: TV .23 > .2 (masked by dppo_tv), binary KL 0.1773 <= 0.2 (kept by dppo_kl);
    the ratio 5.6 is truncated at c = 3 (pg_clipfrac_lower)."""
    old, new = torch.log(torch.tensor([[0.05]])), torch.log(torch.tensor([[0.28]]))
    kwargs = dict(old_log_prob=old, advantages=torch.ones(1, 1), response_mask=torch.ones(1, 1), clip_ratio=0.2,
                  clip_ratio_c=3.0)
    tv_loss, tv_metrics = get_policy_loss("dppo_tv")(log_prob=new, **kwargs)
    kl_loss, kl_metrics = get_policy_loss("dppo_kl")(log_prob=new, **kwargs)
    binary_kl = 0.05 * LN(0.05 / 0.28) + 0.95 * LN(0.95 / 0.72)
    assert binary_kl == pytest.approx(0.1773, abs=1e-4)
    assert tv_loss.item() == 0.0 and tv_metrics["pg_clipfrac"] == 1.0
    assert kl_loss.item() == pytest.approx(-3.0 * LN(0.28)) and kl_metrics["pg_clipfrac_lower"] == 1.0


def test_dro_is_policy_gradient_minus_a_quadratic_log_ratio_penalty():
    """l = -(A log p - beta/2 (log p - log q)^2)."""
    old = torch.tensor([[-1.0, -2.0, -1.0]])
    log_prob = torch.tensor([[-0.5, -2.5, 30.0]], requires_grad=True)
    advantages = torch.tensor([[2.0, -1.0, 1.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, metrics = get_policy_loss("dro")(old_log_prob=old, log_prob=log_prob, advantages=advantages,
                                           response_mask=mask, dro_beta=0.1, loss_agg_mode="token-mean")
    per_token = [-(2.0 * -0.5 - 0.05 * 0.25), -(-1.0 * -2.5 - 0.05 * 0.25)]
    assert loss.item() == pytest.approx(sum(per_token) / 2)
    expected_grad = [(-2.0 + 0.1 * 0.5) / 2, (1.0 + 0.1 * -0.5) / 2, 0.0]  # -A + beta (log p - log q)
    torch.testing.assert_close(_grad(loss, log_prob), torch.tensor([expected_grad]))
    assert metrics["ppo_kl"] == pytest.approx(0.0)  # mean of (-0.5, +0.5)


def test_dro_without_beta_names_the_key():
    with pytest.raises(AlgorithmError, match="policy_loss.dro_beta"):
        get_policy_loss("dro")(old_log_prob=torch.zeros(1, 1), log_prob=torch.zeros(1, 1),
                               advantages=torch.ones(1, 1), response_mask=torch.ones(1, 1))


# bypass mode: old log-probs are the engine's; multi-turn row 1 (t1 observation)
BY_ROLLOUT = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -9.0, -2.0]])
BY_DELTA = torch.tensor([[LN(3.0), LN(0.9), 0.0], [LN(1.1), 50.0, LN(0.5)]])  # log pi_theta - log pi_rollout
BY_ADV = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
BY_MASK = torch.tensor([[1, 1, 1], [1, 0, 1]])


def test_bypass_ppo_clip_is_vanilla_on_the_mask_left_after_rejection():
    log_prob = (BY_ROLLOUT + BY_DELTA).requires_grad_(True)
    kwargs = dict(old_log_prob=BY_ROLLOUT, advantages=BY_ADV, clip_ratio=0.2, loss_agg_mode="token-sum")
    loss, metrics = get_policy_loss("bypass_mode")(log_prob=log_prob, response_mask=BY_MASK, loss_type="ppo_clip",
                                                   rollout_rs="token_k1", rollout_rs_threshold="0.4_2.5", **kwargs)
    # token_k1 keeps ratios in [0.4, 2.5]: the ratio 3 (row 0, t0) is rejected
    kept = torch.tensor([[0, 1, 1], [1, 0, 1]])
    reference, _ = get_policy_loss("vanilla")(log_prob=log_prob, response_mask=kept, **kwargs)
    assert loss.item() == pytest.approx(reference.item())
    # ratio 0.9 (A>0): -0.9; ratio 1: -1; ratio 1.1 (A<0): 1.1; ratio 0.5 (A<0, clipped at 0.8): 0.8
    assert loss.item() == pytest.approx(-0.9 - 1.0 + 1.1 + 0.8)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1 / 5)
    assert metrics["rollout_corr/kl"] == pytest.approx(-(LN(3.0) + LN(0.9) + LN(1.1) + LN(0.5)) / 5)


def test_bypass_reinforce_weights_the_policy_gradient_by_truncated_is():
    log_prob = (BY_ROLLOUT + BY_DELTA).requires_grad_(True)
    loss, metrics = get_policy_loss("bypass_mode")(
        old_log_prob=BY_ROLLOUT, log_prob=log_prob, advantages=BY_ADV, response_mask=BY_MASK, loss_type="reinforce",
        rollout_is="token", rollout_is_threshold=2.0, loss_agg_mode="token-sum")
    weights = torch.tensor([[2.0, 0.9, 1.0], [1.1, 0.0, 0.5]])  # TIS at 2; the observation has no weight
    expected = (-BY_ADV * weights * log_prob.detach() * BY_MASK).sum()
    assert loss.item() == pytest.approx(expected.item())
    torch.testing.assert_close(_grad(loss, log_prob), -BY_ADV * weights * BY_MASK)
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 5)


def test_bypass_rejects_an_unknown_loss_type():
    with pytest.raises(AlgorithmError, match="ppo_clip or reinforce"):
        get_policy_loss("bypass_mode")(old_log_prob=BY_ROLLOUT, log_prob=BY_ROLLOUT, advantages=BY_ADV,
                                       response_mask=BY_MASK, loss_type="a2c")


@pytest.mark.parametrize("name", ["vanilla", "gpg", "cispo", "clip_cov", "sapo", "dppo_tv",
                                  "dppo_kl", "dro"])
def test_rollout_is_weights_scale_every_token_loss(name):
    """Decoupled rollout correction: each loss multiplies its per-token loss by sg(w) before aggregating."""
    old = torch.tensor([[-1.0, -1.5, -2.0]])
    log_prob = torch.tensor([[-0.9, -1.5, -2.2]])
    weights = torch.tensor([[2.0, 0.5, 1.0]])
    kwargs = dict(old_log_prob=old, log_prob=log_prob, advantages=torch.tensor([[1.0, -1.0, 0.5]]),
                  loss_agg_mode="token-sum", dro_beta=0.1)
    per_token = [get_policy_loss(name)(response_mask=torch.eye(3)[t:t + 1], **kwargs)[0].item() for t in range(3)]
    weighted, _ = get_policy_loss(name)(response_mask=torch.ones(1, 3), rollout_is_weights=weights, **kwargs)
    if name == "sapo":  # always seq-mean-token-mean: a one-token "sequence" is its token, the full one a mean
        per_token = [value / 3 for value in per_token]
    assert weighted.item() == pytest.approx(sum(w * v for w, v in zip(weights[0].tolist(), per_token)), abs=1e-6)


@pytest.mark.parametrize("name", ["vanilla", "gspo", "gpg", "cispo", "kl_cov", "geo_mean", "sapo", "dppo_tv",
                                  "dppo_kl", "dro", "bypass_mode"])
@pytest.mark.parametrize("garbage", [50.0, float("nan")])
def test_observation_spans_contribute_nothing(name, garbage):
    """A multi-turn row (turn, 2 observation tokens with garbage old and new log-probs, turn) gives the loss of
    the same row with the observation tokens cut out; the gradient is finite and 0 on them."""
    old = torch.tensor([[-1.0, -2.0, -3.0, -1.5], [-0.5, -1.0, -2.0, -0.7]])
    delta = torch.tensor([[0.1, 0.0, 0.0, -0.2], [0.05, 0.3, -0.1, 0.0]])
    advantages = torch.tensor([[1.0, 1.0, 1.0, 1.0], [-0.5, -0.5, -0.5, -0.5]])
    kwargs = dict(loss_agg_mode="token-mean", dro_beta=0.1, loss_type="reinforce", rollout_is="token")
    multi_turn_mask = torch.tensor([[1, 0, 0, 1], [1, 1, 1, 0]])
    log_prob, old_garbage = (old + delta).clone(), old.clone()
    log_prob[0, 1:3], old_garbage[0, 1:3] = garbage, -garbage  # e.g. an engine's value for unsampled tokens
    log_prob.requires_grad_(True)
    loss, _ = get_policy_loss(name)(old_log_prob=old_garbage, log_prob=log_prob, advantages=advantages,
                                    response_mask=multi_turn_mask, **kwargs)
    keep = [[0, 3, 0], [0, 1, 2]]  # row 0's own tokens (padded with a masked copy), row 1's
    packed = lambda x: torch.stack([x[0, keep[0]], x[1, keep[1]]])  # noqa: E731
    reference, _ = get_policy_loss(name)(old_log_prob=packed(old), log_prob=packed(old + delta),
                                         advantages=packed(advantages),
                                         response_mask=torch.tensor([[1, 1, 0], [1, 1, 1]]), **kwargs)
    assert loss.item() == pytest.approx(reference.item(), rel=1e-5, abs=1e-7)
    (grad,) = torch.autograd.grad(loss, log_prob)
    assert torch.isfinite(grad).all() and (grad[0, 1:3] == 0).all()

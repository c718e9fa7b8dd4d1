import math

import pytest
import torch

from hybridflow.algos import AlgorithmError, get_policy_loss, list_loss_agg_modes, list_policy_losses

# token:            0: A>0 ratio above 1+eps_high   1: A>0 ratio 0.5   2: A<0 ratio below 1-eps_low
#                   3: A<0 ratio 5 (dual clip)       4: A<0 ratio 1     5: masked, absurd log-ratio
ADV = torch.tensor([[1.0, 1.0, -1.0], [-1.0, -2.0, 3.0]])
RATIO = [[1.5, 0.5, 0.5], [5.0, 1.0, 1.0]]
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -1.0, -1.0]])
# losses whose per-call result is a share of the batch loss (global counts), the new verl 0.9 ones included
SPLIT_INVARIANT = ["vanilla", "gspo", "gpg", "cispo", "geo_mean", "sapo", "dppo_tv", "dppo_kl", "dro", "bypass_mode"]
KNOBS = {"dro_beta": 0.1}  # dro has no default beta; the other losses ignore it


def _log_prob(ratio=RATIO, old=OLD, masked_log_ratio=500.0):
    log_ratio = torch.tensor([[math.log(r) for r in row] for row in ratio])
    log_ratio[1, 2] = masked_log_ratio
    return (old + log_ratio).requires_grad_(True)


def test_vanilla_clip_higher_and_dual_clip_by_hand():
    log_prob = _log_prob()
    loss, metrics = get_policy_loss("vanilla")(
        old_log_prob=OLD, log_prob=log_prob, advantages=ADV, response_mask=MASK, clip_ratio=0.2, clip_ratio_high=0.28
    )
    per_token = [-1.28, -0.5, 0.8, 3.0, 2.0]
    assert loss.item() == pytest.approx(sum(per_token) / 5)
    assert metrics["pg_clipfrac"] == pytest.approx(2 / 5)  # tokens 0 and 2: the clipped term is larger
    assert metrics["pg_clipfrac_lower"] == pytest.approx(1 / 5)  # token 3
    log_ratios = [math.log(1.5), math.log(0.5), math.log(0.5), math.log(5.0), 0.0]
    assert metrics["ppo_kl"] == pytest.approx(-sum(log_ratios) / 5)
    (grad,) = torch.autograd.grad(loss, log_prob)
    # d/dlogp (-A rho) = -A rho on unclipped tokens; clipped, dual-clipped and masked tokens get 0
    expected = torch.tensor([[0.0, -1.0 * 0.5, 0.0], [0.0, 2.0 * 1.0, 0.0]]) / 5
    torch.testing.assert_close(grad, expected)


def test_vanilla_rejects_dual_clip_at_or_below_one():
    with pytest.raises(AlgorithmError, match="clip_ratio_c"):
        get_policy_loss("vanilla")(old_log_prob=OLD, log_prob=OLD, advantages=ADV, response_mask=MASK, clip_ratio_c=1.0)


def test_gspo_uses_the_length_normalised_sequence_ratio():
    log_prob = _log_prob()
    loss, metrics = get_policy_loss("gspo")(
        old_log_prob=OLD, log_prob=log_prob, advantages=ADV, response_mask=MASK, clip_ratio=0.5,
        loss_agg_mode="seq-mean-token-mean",
    )
    s0 = math.exp((math.log(1.5) + math.log(0.5) + math.log(0.5)) / 3)  # 0.72 -> inside [0.5, 1.5]
    s1 = math.exp((math.log(5.0) + 0.0) / 2)  # 2.236 > 1.5, but A < 0 makes the unclipped term the max
    row0 = [-1.0 * s0, -1.0 * s0, 1.0 * s0]
    row1 = [1.0 * s1, 2.0 * s1]  # A<0: max(-A s, -A clip(s)) = -A s since s > 1.5
    assert loss.item() == pytest.approx((sum(row0) / 3 + sum(row1) / 2) / 2, rel=1e-5)
    assert metrics["pg_clipfrac"] == 0.0
    (grad,) = torch.autograd.grad(loss, log_prob)
    # d(-A s_it)/dlogp_t = -A s_i, times 1/|y_i| (token mean) times 1/2 (sequence mean)
    expected = torch.tensor([[-s0 / 3, -s0 / 3, s0 / 3], [s1 / 2, 2 * s1 / 2, 0.0]]) / 2
    torch.testing.assert_close(grad, expected)


def test_gspo_clips_a_positive_advantage_sequence_as_a_whole():
    log_prob = _log_prob()
    advantages = torch.ones(2, 3)
    loss, metrics = get_policy_loss("gspo")(
        old_log_prob=OLD, log_prob=log_prob, advantages=advantages, response_mask=MASK, clip_ratio=0.2
    )
    s0, s1 = math.exp((math.log(1.5) + 2 * math.log(0.5)) / 3), math.sqrt(5.0)
    assert loss.item() == pytest.approx((-3 * s0 - 2 * 1.2) / 5, rel=1e-5)  # row 1 clipped at 1 + 0.2
    assert metrics["pg_clipfrac"] == pytest.approx(2 / 5)
    (grad,) = torch.autograd.grad(loss, log_prob)
    assert grad[1].abs().sum() == 0 and grad[0, 0].item() == pytest.approx(-s0 / 5)


def test_gpg_is_reinforce_on_log_prob():
    log_prob = _log_prob()
    loss, metrics = get_policy_loss("gpg")(old_log_prob=OLD, log_prob=log_prob, advantages=ADV, response_mask=MASK)
    lp = log_prob.detach()
    valid = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    expected = -sum(ADV[i, t].item() * lp[i, t].item() for i, t in valid) / 5
    assert loss.item() == pytest.approx(expected)
    (grad,) = torch.autograd.grad(loss, log_prob)
    torch.testing.assert_close(grad, -ADV * MASK / 5)
    assert metrics["pg_clipfrac"] == 0.0


def test_cispo_clips_the_weight_but_keeps_every_tokens_gradient():
    log_prob = _log_prob()
    loss, metrics = get_policy_loss("cispo")(
        old_log_prob=OLD, log_prob=log_prob, advantages=ADV, response_mask=MASK, clip_ratio=0.2, clip_ratio_high=0.28
    )
    weights = torch.tensor([[1.28, 0.8, 0.8], [1.28, 1.0, 0.0]])
    lp = log_prob.detach()
    assert loss.item() == pytest.approx((-(ADV * weights * lp) * MASK).sum().item() / 5, rel=1e-6)
    (grad,) = torch.autograd.grad(loss, log_prob)
    torch.testing.assert_close(grad, -ADV * weights * MASK / 5)  # non-zero where PPO's clip would cut
    assert metrics["pg_clipfrac"] == pytest.approx(4 / 5)
    assert metrics["pg_clipfrac_lower"] == pytest.approx(2 / 5)


def _cov_batch():
    """Advantages / log-probs whose centred products are known: only (0,0) and (1,1) are large."""
    advantages = torch.tensor([[2.0, 0.0, 0.0], [0.0, -2.0, 0.0]])
    log_prob = torch.tensor([[-1.0, -3.0, -3.0], [-3.0, -5.0, -3.0]])
    return advantages, log_prob


def test_covariance_selection_by_hand():
    advantages, log_prob = _cov_batch()
    # means: A -> 0, log p -> -3; cov = A * (logp + 3): (0,0) = 2 * 2 = 4, (1,1) = -2 * -2 = 4, rest 0
    cov_expected = torch.tensor([[4.0, 0.0, 0.0], [0.0, 4.0, 0.0]])
    from hybridflow.algos.policy_losses.covariance import token_covariance

    cov = token_covariance(advantages=advantages, log_prob=log_prob, response_mask=torch.ones(2, 3))
    torch.testing.assert_close(cov, cov_expected)


def test_clip_cov_drops_the_gradient_of_picked_high_covariance_tokens():
    advantages, old = _cov_batch()
    log_prob = old.clone().requires_grad_(True)  # on-policy: ratio 1, nothing ratio-clipped
    mask = torch.ones(2, 3)
    loss, metrics = get_policy_loss("clip_cov")(
        old_log_prob=old, log_prob=log_prob, advantages=advantages, response_mask=mask,
        clip_cov_ratio=2 / 6, clip_cov_lb=1.0, clip_cov_ub=5.0, generator=torch.Generator().manual_seed(0),
    )
    # both candidates (cov 4 in (1, 5)) are picked: count = floor(2/6 * 6) = 2
    assert metrics["pg_clipfrac"] == pytest.approx(2 / 6)
    assert loss.item() == pytest.approx(0.0)  # the only non-zero advantages were dropped
    (grad,) = torch.autograd.grad(loss, log_prob)
    assert grad.abs().sum() == 0


def test_clip_cov_picks_at_random_among_candidates_with_a_seeded_generator():
    advantages, old = _cov_batch()
    picked = []
    for seed in range(8):
        log_prob = old.clone().requires_grad_(True)
        loss, metrics = get_policy_loss("clip_cov")(
            old_log_prob=old, log_prob=log_prob, advantages=advantages, response_mask=torch.ones(2, 3),
            clip_cov_ratio=1e-4, generator=torch.Generator().manual_seed(seed),
        )
        (grad,) = torch.autograd.grad(loss, log_prob)
        assert metrics["pg_clipfrac"] == pytest.approx(1 / 6)  # count = max(floor(6e-4), 1) = 1
        picked.append((grad == 0) & (advantages != 0))
    assert all(p.sum() == 1 for p in picked)
    assert len({tuple(p.flatten().tolist()) for p in picked}) == 2  # both candidates get picked sometimes


def test_kl_cov_penalises_the_top_covariance_tokens():
    advantages, old = _cov_batch()
    log_prob = (old + torch.tensor([[0.5, 0.1, 0.0], [0.0, -0.5, 0.2]])).requires_grad_(True)
    mask = torch.ones(2, 3)
    loss, metrics = get_policy_loss("kl_cov")(
        old_log_prob=old, log_prob=log_prob, advantages=advantages, response_mask=mask,
        kl_cov_ratio=2 / 6, ppo_kl_coef=0.5,
    )
    lp = log_prob.detach()
    cov = advantages * (lp - lp.mean())  # A has mean 0
    top2 = cov.flatten().topk(2).indices.tolist()
    log_ratio = (lp - old).flatten()
    per_token = [-advantages.flatten()[i] * math.exp(log_ratio[i]) for i in range(6)]
    for i in top2:
        per_token[i] += 0.5 * abs(log_ratio[i])
    assert loss.item() == pytest.approx(sum(float(x) for x in per_token) / 6, rel=1e-6)
    assert metrics["pg_clipfrac"] == pytest.approx(2 / 6)
    assert metrics["ppo_kl_abs"] == pytest.approx(log_ratio.abs().mean().item())


@pytest.mark.parametrize("name", sorted({"clip_cov", "kl_cov", *SPLIT_INVARIANT} - {"dro"}))
@pytest.mark.parametrize("log_ratio", [1000.0, -1000.0, 80.0])
def test_extreme_log_ratios_give_finite_loss_and_grad(name, log_ratio):
    old = torch.full((2, 3), -1.0)
    log_prob = (old + log_ratio).requires_grad_(True)
    loss, metrics = get_policy_loss(name)(old_log_prob=old, log_prob=log_prob, advantages=ADV, response_mask=MASK,
                                          **KNOBS)
    (grad,) = torch.autograd.grad(loss, log_prob)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    # a perplexity of exp(1000) is inf, honestly (bypass_mode's rollout_corr/*ppl*, as verl)
    assert all(math.isfinite(v) for k, v in metrics.items() if "ppl" not in k)


@pytest.mark.parametrize("name", sorted({"clip_cov", "kl_cov", *SPLIT_INVARIANT}))
def test_all_masked_batch_gives_zero_loss_and_zero_grad(name):
    log_prob = torch.randn(2, 3).requires_grad_(True)
    loss, metrics = get_policy_loss(name)(
        old_log_prob=torch.randn(2, 3), log_prob=log_prob, advantages=torch.randn(2, 3), response_mask=torch.zeros(2, 3),
        **KNOBS,
    )
    (grad,) = torch.autograd.grad(loss, log_prob)
    assert loss.item() == 0.0 and torch.equal(grad, torch.zeros(2, 3))
    assert set(metrics) >= {"pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"}


def test_every_registered_loss_returns_float_metrics_with_the_verl_keys():
    for name in list_policy_losses():
        _, metrics = get_policy_loss(name)(old_log_prob=OLD, log_prob=_log_prob(), advantages=ADV, response_mask=MASK,
                                           index=["p", "p"], **KNOBS)  # one prompt's two responses (gvpo's groups)
        assert {"pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"} <= set(metrics), name
        assert all(isinstance(v, float) for v in metrics.values()), name


def _random_rollout(seed, batch=8, width=5):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, width, generator=gen) * 3
    delta = torch.randn(batch, width, generator=gen) * 0.4  # some tokens clip, some do not
    advantages = torch.randn(batch, width, generator=gen)
    lengths = torch.tensor([5, 1, 0, 3, 5, 2, 4, 1])
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    return old, delta, advantages, mask


def _loss_and_grad(name, mode, old, delta, advantages, mask, **counts):
    delta = delta.clone().requires_grad_(True)
    loss, _ = get_policy_loss(name)(
        old_log_prob=old, log_prob=old + delta, advantages=advantages, response_mask=mask,
        loss_agg_mode=mode, clip_ratio=0.2, clip_ratio_high=0.28, max_response_length=5, **KNOBS, **counts,
    )
    (grad,) = torch.autograd.grad(loss, delta)
    return loss.detach(), grad


@pytest.mark.parametrize("name", SPLIT_INVARIANT)
@pytest.mark.parametrize("mode", list_loss_agg_modes())
def test_loss_and_grad_are_invariant_to_micro_batches_and_dp_shards(name, mode):
    old, delta, advantages, mask = _random_rollout(0)
    full_loss, full_grad = _loss_and_grad(name, mode, old, delta, advantages, mask)
    counts = {"global_num_tokens": mask.sum().item(), "global_num_seqs": (mask.sum(-1) > 0).sum().item()}
    total_loss, grads = torch.tensor(0.0), []
    for shard in (slice(0, 4), slice(4, 8)):  # 2 data-parallel ranks
        rows = torch.arange(8)[shard]
        for micro in (rows[:1], rows[1:]):  # uneven micro-batches
            loss, grad = _loss_and_grad(name, mode, old[micro], delta[micro], advantages[micro], mask[micro], **counts)
            total_loss += loss
            grads.append(grad)
    torch.testing.assert_close(total_loss, full_loss)
    torch.testing.assert_close(torch.cat(grads), full_grad)


def test_negative_clip_ratio_is_refused():
    with pytest.raises(AlgorithmError, match="clip_ratio_low"):
        get_policy_loss("vanilla")(
            old_log_prob=OLD, log_prob=OLD, advantages=ADV, response_mask=MASK, clip_ratio_low=-0.1
        )


@pytest.mark.parametrize("name", ["vanilla", "gspo", "gpg", "cispo"])
def test_bf16_inputs_match_fp32_on_a_tiny_batch(name):
    log_prob = _log_prob(masked_log_ratio=0.0).detach()
    kwargs = {"old_log_prob": OLD, "log_prob": log_prob, "advantages": ADV, "response_mask": MASK}
    reference, _ = get_policy_loss(name)(**kwargs)
    low_precision, _ = get_policy_loss(name)(**{k: v.bfloat16() for k, v in kwargs.items()})
    assert torch.isfinite(low_precision)
    assert low_precision.float().item() == pytest.approx(reference.item(), rel=3e-2, abs=3e-2)

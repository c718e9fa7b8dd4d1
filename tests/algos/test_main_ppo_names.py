"""Every name issue 13 added, run for one step from ``main_ppo`` on the tiny model (fast tier)."""

from __future__ import annotations

import json
import math

import pytest

from hybridflow.config import PPOConfig, load_config
from hybridflow.errors import ConfigError
from hybridflow.trainer.main_ppo import run_ppo
from tests.trainer.ppo_fixtures import base_overrides

ACTOR = "actor_rollout_ref.actor"
CORR = "algorithm.rollout_correction"


def _run(tmp_path, model_dir, extra, *, estimator="grpo") -> dict:
    run_ppo(load_config(PPOConfig, base_overrides(tmp_path, model_dir, estimator=estimator, steps=1) + extra))
    rows = (tmp_path / "ckpt" / "logs" / "metrics.jsonl").read_text().splitlines()
    return json.loads(rows[-1])


@pytest.mark.parametrize("extra", [
    [f"{ACTOR}.policy_loss.loss_mode=geo_mean", f"{ACTOR}.clip_ratio=0.4"],
    [f"{ACTOR}.policy_loss.loss_mode=sapo", f"{ACTOR}.tau_pos=1.0", f"{ACTOR}.tau_neg=1.05"],
    [f"{ACTOR}.policy_loss.loss_mode=dppo_tv"],
    [f"{ACTOR}.policy_loss.loss_mode=dppo_kl", f"{ACTOR}.clip_ratio_c=20.0"],
    [f"{ACTOR}.policy_loss.loss_mode=dro", f"{ACTOR}.policy_loss.dro_beta=0.1",
     f"{ACTOR}.use_kl_loss=True", f"{ACTOR}.kl_loss_type=abs+"],
], ids=["geo_mean", "sapo", "dppo_tv", "dppo_kl", "dro+abs_plus_kl"])
def test_new_policy_losses_run_a_step(tmp_path, tiny_model_dir, extra):
    last = _run(tmp_path, tiny_model_dir, extra)
    assert math.isfinite(last["actor/pg_loss"]) and math.isfinite(last["actor/grad_norm"])
    # decoupled mode always reports the engine/trainer gap, as verl
    assert abs(last["rollout_corr/kl"]) < 1e-3 and "rollout_corr/chi2_token" in last


@pytest.mark.parametrize("extra, key", [
    ([f"{CORR}.bypass_mode=True", f"{CORR}.rollout_rs=token_k1,seq_max_k2", f"{CORR}.rollout_rs_threshold=0.5_2.0,1.0"],
     "rollout_corr/rollout_rs_masked_fraction"),
    ([f"{CORR}.bypass_mode=True", f"{CORR}.loss_type=reinforce", f"{CORR}.rollout_is=token"],
     "rollout_corr/rollout_is_mean"),
], ids=["bypass_ppo_clip_rs", "bypass_reinforce_is"])
def test_bypass_mode_runs_a_step_without_the_recompute_pass(tmp_path, tiny_model_dir, extra, key):
    last = _run(tmp_path, tiny_model_dir, extra)
    assert "timing_s/old_log_prob" in last and key in last
    assert "training/rollout_probs_diff_mean" not in last  # no recomputed log-probs to compare with


@pytest.mark.parametrize("extra", [
    [f"{CORR}.rollout_is=token", f"{CORR}.rollout_is_threshold=2.0", f"{CORR}.rollout_rs=seq_mean_k3",
     f"{CORR}.rollout_rs_threshold=0.01"],
    [f"{CORR}.rollout_is=sequence", f"{CORR}.rollout_is_threshold=0.5_5.0", f"{CORR}.rollout_is_batch_normalize=True"],
], ids=["token_tis_rs", "sequence_icepop_normalized"])
def test_decoupled_rollout_correction_runs_a_step(tmp_path, tiny_model_dir, extra):
    last = _run(tmp_path, tiny_model_dir, extra)
    # the native fp32 engine and the trainer agree: weights ~1, nothing rejected
    assert last["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-3)
    assert last.get("rollout_corr/rollout_rs_masked_fraction", 0.0) == 0.0


@pytest.mark.parametrize("method", ["pow", "max_min", "max_random"])
def test_pf_ppo_runs_a_step(tmp_path, tiny_model_dir, method):
    last = _run(tmp_path, tiny_model_dir, ["algorithm.use_pf_ppo=True", f"algorithm.pf_ppo.reweight_method={method}",
                                           "algorithm.pf_ppo.weight_pow=2.0"])
    assert math.isfinite(last["actor/pg_loss"])


def test_loss_scale_factor_reaches_the_actor_and_the_critic(tmp_path, tiny_model_dir):
    """seq-mean-token-sum-norm divides by loss_scale_factor: 1 vs 1000 scales the first-step losses and their
    (pre-clip) gradient norms by 1000; one mini-batch, so all are computed before any update. (GAE's whitened
    advantages make the actor's pg_loss itself ~0, so the actor side is checked on its gradient norm.)"""
    common = [f"{ACTOR}.loss_agg_mode=seq-mean-token-sum-norm", f"{ACTOR}.ppo_mini_batch_size=4"]
    small = _run(tmp_path / "a", tiny_model_dir, common + [f"{ACTOR}.loss_scale_factor=1000"], estimator="gae")
    large = _run(tmp_path / "b", tiny_model_dir, common + [f"{ACTOR}.loss_scale_factor=1"], estimator="gae")
    for key in ("actor/grad_norm", "critic/vf_loss", "critic/grad_norm"):
        assert large[key] == pytest.approx(1000 * small[key], rel=1e-3), key


@pytest.mark.parametrize("extra, message", [
    (["algorithm.adv_estimator=optimal_token_baseline"], "calculate_sum_pi_squared=True"),
    (["algorithm.adv_estimator=gdpo"], "gdpo_reward_keys"),
    ([f"{ACTOR}.policy_loss.loss_mode=dro"], "dro_beta"),
    ([f"{CORR}.bypass_mode=True", f"{ACTOR}.policy_loss.loss_mode=gspo"], "leave policy_loss.loss_mode=vanilla"),
    ([f"{CORR}.rollout_rs=token_k9", f"{CORR}.rollout_rs_threshold=1"], "token_k1"),
    (["algorithm.use_pf_ppo=True", "algorithm.pf_ppo.reweight_method=best"], "max_random"),
])
def test_missing_or_bad_algorithm_settings_fail_before_the_model_loads(tmp_path, tiny_model_dir, extra, message):
    with pytest.raises(ConfigError, match=message):
        _run(tmp_path, tiny_model_dir, extra)


@pytest.mark.parametrize("extra", [
    [f"{CORR}.rollout_is=token", f"{CORR}.rollout_is_threshold=1.5_2.0"],
    [f"{CORR}.bypass_mode=True", f"{CORR}.rollout_rs=token_k1", f"{CORR}.rollout_rs_threshold=1.5_2.0"],
], ids=["decoupled_icepop", "bypass_rejection"])
def test_corrections_reach_the_actor_loss(tmp_path, tiny_model_dir, extra):
    """A band that excludes ratio 1 zeroes every IS weight (decoupled) / rejects every token (bypass): the
    actor's loss and gradient must then be exactly 0."""
    last = _run(tmp_path, tiny_model_dir, extra + [f"{ACTOR}.ppo_mini_batch_size=4"])
    assert last["actor/pg_loss"] == 0.0 and last["actor/grad_norm"] == 0.0

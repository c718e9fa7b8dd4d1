"""PRIME end to end on the tiny model (python -m hybridflow.trainer.main_prime with the recipe's keys): the implicit
PRM trains, its loss and dense rewards are logged, the advantages combine both reward sources, resume restores it."""

from __future__ import annotations

import json

import pytest
import torch

from hybridflow.config import PPOConfig, load_config
from hybridflow.errors import ConfigError
from hybridflow.trainer.main_ppo import ppo_parts
from hybridflow.trainer.roles.assembly import build_loop
from hybridflow.trainer.main_prime import PRIME_DEFAULTS, main, recipe_meaning
from tests.trainer.ppo_fixtures import base_overrides

# the PRIME keys of verl-recipe's run_prime_qwen.sh (lr raised so that two tiny steps move the weights)
RECIPE_KEYS = ["reward_model.micro_batch_size_per_gpu=2", "reward_model.model.update=before",
               "reward_model.model.beta_train=0.05", "reward_model.model.optim.lr=1e-2",
               "reward_model.model.optim.grad_clip=10.0", "reward_model.mini_batch_size=2",
               "algorithm.adv_estimator=rloo", "trainer.save_freq=2"]


def prime_overrides(tmp_path, model_dir, *extra) -> list[str]:
    return base_overrides(tmp_path, model_dir, estimator="rloo", steps=2) + [
        f"reward_model.model.path={model_dir}", *RECIPE_KEYS, *extra]


def build(overrides):
    return build_loop(recipe_meaning(load_config(PPOConfig, overrides, defaults=PRIME_DEFAULTS)), parts=ppo_parts)


def read_metrics(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "ckpt" / "logs" / "metrics.jsonl").read_text().splitlines()]


def test_prime_trains_the_prm_and_logs_its_loss_and_dense_rewards(tmp_path, tiny_model_dir):
    trainer = build(prime_overrides(tmp_path, tiny_model_dir))
    prm = trainer.w.implicit_prm.backend.worker.prm
    before = {k: v.clone() for k, v in prm.model.state_dict().items()}
    trainer.fit()
    trainer.close()
    moved = [k for k, v in prm.model.state_dict().items() if not torch.equal(v, before[k])]
    assert moved, "the implicit PRM's weights did not change"
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    for name in ("reward_model/dpo_loss", "reward_model/grad_norm", "reward_model/reward",
                 "reward_model/raw_reward", "reward_model/dpo_acc", "reward_model/dpo_acc_abs", "rm/lr", "timing_s/prm"):
        assert all(torch.isfinite(torch.tensor(r[name])) for r in rows), name
    # step 1 scores with the PRM after one update from the reference's weights: a non-zero log-ratio
    assert rows[0]["reward_model/raw_reward"] != 0.0
    assert rows[0]["rm/lr"] == pytest.approx(1e-2)
    assert (tmp_path / "ckpt" / "global_step_2" / "reward").is_dir()  # checkpointed beside the actor


def test_a_frozen_prm_at_the_reference_gives_no_dense_reward(tmp_path, tiny_model_dir):
    """update=none: pi_phi = pi_ref, so the log-ratio is exactly 0 (the PRM reads the reference's forward)."""
    trainer = build(prime_overrides(tmp_path, tiny_model_dir, "reward_model.model.update=none",
                                    "trainer.total_training_steps=1"))
    trainer.fit()
    trainer.close()
    row = read_metrics(tmp_path)[-1]
    assert row["reward_model/raw_reward"] == 0.0 and "reward_model/dpo_loss" not in row


def test_dense_coefficient_zero_gives_the_outcome_only_advantages(tmp_path, tiny_model_dir, monkeypatch):
    """The advantages the trainer computes are the estimator's of (dense, outcome); with reward_dpo_coef=0 they equal
    those of the outcome alone, and with the dense rewards on they differ."""
    from hybridflow.algos.prime import prime_advantages
    from hybridflow.trainer.loop import ppo_update as ppo

    seen = []
    original = ppo.PPOUpdate.compute_rewards_and_advantages

    def record(self, batch):
        out = original(self, batch)
        seen.append((batch["advantages"].clone(), batch["prm_rewards"].clone(), batch["token_level_rewards"].sum(-1),
                     batch["response_mask"].float()))
        return out

    monkeypatch.setattr(ppo.PPOUpdate, "compute_rewards_and_advantages", record)
    for coef in (0.0, 5.0):
        trainer = build(prime_overrides(tmp_path / str(coef), tiny_model_dir, f"algorithm.reward_dpo_coef={coef}",
                                        "trainer.total_training_steps=1"))
        trainer.fit()
        trainer.close()
    (adv_off, dense, outcome, mask), (adv_on, dense_on, outcome_on, mask_on) = seen
    outcome_only, _ = prime_advantages(dense_rewards=torch.zeros_like(dense), outcome_scores=outcome,
                                       response_mask=mask, n=2, dense_coef=0.0, outcome_coef=5.0)
    torch.testing.assert_close(adv_off, outcome_only)
    assert dense_on.abs().sum() > 0
    both, _ = prime_advantages(dense_rewards=dense_on, outcome_scores=outcome_on, response_mask=mask_on, n=2,
                               dense_coef=5.0, outcome_coef=5.0)
    torch.testing.assert_close(adv_on, both)


def test_resume_restores_the_prm(tmp_path, tiny_model_dir):
    overrides = prime_overrides(tmp_path, tiny_model_dir)
    first = build(overrides)
    first.fit()
    trained = {k: v.clone() for k, v in first.w.implicit_prm.backend.worker.prm.model.state_dict().items()}
    first.close()
    resumed = build(overrides[:-1] + ["trainer.save_freq=2", "trainer.total_training_steps=2"])
    assert resumed.load_checkpoint() == 2
    state = resumed.w.implicit_prm.backend.worker.prm.model.state_dict()
    resumed.close()
    for key, value in trained.items():
        torch.testing.assert_close(state[key], value)


def test_recipe_keys_that_cannot_run_are_one_line_each(tmp_path, tiny_model_dir, capsys):
    code = main(prime_overrides(tmp_path, tiny_model_dir, "reward_model.model.update=reverse",
                                "reward_model.prime_norm=l2"))
    err = capsys.readouterr().err
    assert code != 0
    assert "reward_model.model.update='reverse': use before" in err
    assert "reward_model.prime_norm='l2'" in err
    with pytest.raises(ConfigError, match="algorithm.adv_estimator='grpo'.*use rloo"):
        recipe_meaning(load_config(PPOConfig, prime_overrides(tmp_path, tiny_model_dir, "algorithm.adv_estimator=grpo"),
                                   defaults=PRIME_DEFAULTS))


def test_prm_optimizer_settings_are_checked_before_loading(tmp_path, tiny_model_dir, capsys):
    assert main(prime_overrides(tmp_path, tiny_model_dir, "reward_model.model.optim.lr=-1")) != 0
    assert "reward_model.model.optim.lr=-1.0 must be a finite number >= 0" in capsys.readouterr().err


def test_the_recipe_s_accuracy_filter_trains_on_train_batch_size_of_an_oversampled_batch(tmp_path, tiny_model_dir):
    """run_prime_qwen.sh's YAML filter (accuracy within [0.2, 0.8], oversample_factor 2): each step generates twice
    the train batch's prompt groups and trains on train_batch_size of them."""
    overrides = prime_overrides(tmp_path, tiny_model_dir, "data.filter_accuracy=True", "data.accuracy_lower_bound=0.2",
                                "data.accuracy_upper_bound=0.8", "data.oversample_factor=2.0")
    trainer = build(overrides)
    groups = trainer.cfg.data.train_batch_size
    assert trainer.run.train_loader.batch_size == 2 * groups
    trainer.fit()
    trainer.close()
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["train/prime_groups_seen"] == 2 * groups for r in rows)
    assert all(0 <= r["train/prime_passing_groups"] <= 2 * groups for r in rows)

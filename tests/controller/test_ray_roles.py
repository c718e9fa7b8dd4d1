"""Issue 37 on the Ray backend: a critic beside the actor starts (it hung: the critic asked for half of bundles the
actor filled, and nothing bounded the wait), a mix that does not fit fails at once in one line, validation takes
any number of rows, and verl's one-step-off / fully async recipes start from their own keys (no
``trainer.backend``: split placement picks Ray)."""

from __future__ import annotations

import json
import os
import time

import pandas as pd
import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]
ray = pytest.importorskip("ray")

from hybridflow.config import PPOConfig, load_config  # noqa: E402
from hybridflow.errors import ConfigError  # noqa: E402
from hybridflow.trainer.main_fully_async import main as fully_async_main  # noqa: E402
from hybridflow.trainer.main_one_step_off import main as one_step_off_main  # noqa: E402
from hybridflow.trainer.main_ppo import run_ppo  # noqa: E402
from tests.controller.test_ppo_ray import ray_session  # noqa: E402,F401 (module-scoped, autouse)
from tests.trainer.ppo_fixtures import base_overrides  # noqa: E402

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "verl_commands", "configs")
RAY = ["trainer.backend=ray", "trainer.n_gpus_per_node=2", "ray_kwargs.cpus_per_worker=0.5",
       "ray_kwargs.ray_init.num_cpus=2", "trainer.ray_wait_register_center_timeout=120"]


def metric_rows(root) -> list[dict]:
    return [json.loads(x) for x in (root / "ckpt" / "logs" / "metrics.jsonl").read_text().splitlines()]


def test_ppo_with_a_critic_starts_and_trains_on_ray(tmp_path, tiny_model_dir):
    overrides = base_overrides(tmp_path, tiny_model_dir, estimator="gae", steps=1) + RAY + ["trainer.logger=[file]"]
    run_ppo(load_config(PPOConfig, overrides))
    (row,) = metric_rows(tmp_path)
    assert "critic/vf_loss" in row and "actor/pg_loss" in row


def test_a_rollout_pool_that_does_not_fit_fails_at_once(tmp_path, tiny_model_dir):
    """2 training workers of 1 CPU fill the 2-CPU cluster; a rollout process of its own cannot fit."""
    overrides = base_overrides(tmp_path, tiny_model_dir, steps=1) + [
        "trainer.n_gpus_per_node=2", "ray_kwargs.cpus_per_worker=1", "ray_kwargs.ray_init.num_cpus=2",
        "rollout.n_gpus_per_node=1", "data.train_batch_size=2"]
    started = time.monotonic()
    with pytest.raises(ConfigError) as err:
        fully_async_main(overrides + ["--debug"])
    assert time.monotonic() - started < 100  # the placement wait alone would be 300 s
    (line,) = str(err.value).splitlines()
    assert "is free" in line and "rollout.n_gpus_per_node" in line


def test_validation_rows_need_not_divide_by_the_workers(tmp_path, tiny_model_dir):
    overrides = base_overrides(tmp_path, tiny_model_dir, steps=1) + RAY + [
        "trainer.logger=[file]", "trainer.val_before_train=True", "trainer.test_freq=1"]
    test = pd.read_parquet(tmp_path / "data" / "test.parquet").iloc[:3]  # 3 rows over 2 workers
    test.to_parquet(tmp_path / "data" / "test.parquet")
    run_ppo(load_config(PPOConfig, overrides))
    rows = [row for row in metric_rows(tmp_path) if "val-core/digits/reward/mean@1" in row]
    assert len(rows) == 2  # before training and after step 1


def verl_recipe(tmp_path, tiny_model_dir, config_name: str) -> list[str]:
    """A recipe's own YAML and keys: its rollout pool (rollout.n_gpus_per_node) and nothing hybridflow-only."""
    return ["--config-path", CONFIGS, "--config-name", config_name,
            *base_overrides(tmp_path, tiny_model_dir, steps=2), "trainer.logger=[file]",
            "trainer.nnodes=1", "trainer.n_gpus_per_node=1", "rollout.nnodes=1", "rollout.n_gpus_per_node=1"]


def test_one_step_off_runs_from_verl_s_recipe_keys_alone(tmp_path, tiny_model_dir):
    assert one_step_off_main(verl_recipe(tmp_path, tiny_model_dir, "one_step_off_ppo_trainer")) == 0
    assert [row["step"] for row in metric_rows(tmp_path)] == [1, 2]


def test_fully_async_runs_from_verl_s_recipe_keys_alone(tmp_path, tiny_model_dir):
    """verl's fully async YAML turns partial_rollout on and its scripts stream prompts (train_batch_size=0)."""
    args = verl_recipe(tmp_path, tiny_model_dir, "fully_async_ppo_trainer") + [
        "data.train_batch_size=0", "data.gen_batch_size=1", "rollout.total_rollout_steps=2"]
    assert fully_async_main(args) == 0
    rows = metric_rows(tmp_path)
    assert [row["step"] for row in rows] == [1, 2]
    assert "fully_async/partial/resumed_samples" in rows[-1]


def test_prime_trains_its_prm_beside_the_actor_on_ray(tmp_path, tiny_model_dir):
    """PRIME's implicit PRM takes a share of each of the actor's bundles (a half here: no critic) and trains on 2 ranks."""
    from hybridflow.trainer.main_prime import main as prime_main

    overrides = base_overrides(tmp_path, tiny_model_dir, estimator="rloo", steps=1) + RAY + [
        "trainer.logger=[file]", "reward_model.mini_batch_size=2", "reward_model.model.optim.lr=1e-2"]
    assert prime_main(overrides) == 0
    (row,) = metric_rows(tmp_path)
    assert row["reward_model/raw_reward"] != 0.0 and "reward_model/dpo_loss" in row and "actor/pg_loss" in row

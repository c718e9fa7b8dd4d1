"""Split placement: the rollout engine in a Ray process of its own, the actor in another (verl's one-step-off /
fully async layout). The only path from the trained weights to the engine is the sync through the driver; at
staleness 0 every batch is generated after the previous update's sync, so the engine's sampling log-probs
must equal the trainer's recomputation (``training/rollout_log_probs_diff_mean``: ~1e-7 when the weights
arrive, 0.16 at lr 1e-2 when they do not)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.ray
ray = pytest.importorskip("ray")

from hybridflow.trainer.main_fully_async import main as fully_async_main  # noqa: E402
from tests.controller.test_ppo_ray import ray_session  # noqa: E402,F401 (module-scoped, autouse)
from tests.trainer.ppo_fixtures import base_overrides  # noqa: E402

SPLIT = ["trainer.backend=ray", "trainer.n_gpus_per_node=1", "rollout.n_gpus_per_node=1",
         "ray_kwargs.cpus_per_worker=0.5", "ray_kwargs.ray_init.num_cpus=2"]


def test_the_rollout_process_generates_with_the_trained_weights(tmp_path, tiny_model_dir):
    overrides = base_overrides(tmp_path, tiny_model_dir, steps=3) + SPLIT + [
        "actor_rollout_ref.actor.optim.lr=1e-2", "async_training.staleness_threshold=0", "trainer.logger=[file]"]
    assert fully_async_main(overrides) == 0
    rows = [json.loads(x) for x in (tmp_path / "ckpt" / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert row["actor/grad_norm"] > 0, row["step"]  # the policy moves: a stale engine would show
        assert row["training/rollout_log_probs_diff_mean"] < 1e-4, row["step"]

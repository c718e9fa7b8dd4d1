"""GRPO on a tiny random model learns a trivially learnable reward (about 15 s: kept in the fast tier)."""

import json

from hybridflow.config import PPOConfig, load_config
from hybridflow.trainer.main_ppo import run_ppo
from tests.trainer.ppo_fixtures import base_overrides


def test_grpo_learns_to_emit_digits(tmp_path, tiny_model_dir):
    """Reward = fraction of the response's characters that are digits (chance ~0.2 for the random model)."""
    overrides = base_overrides(tmp_path, tiny_model_dir, steps=60) + [
        "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16", "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.actor.optim.lr=3e-3", "trainer.logger=[file]",
    ]
    run_ppo(load_config(PPOConfig, overrides))
    rows = [json.loads(x) for x in (tmp_path / "ckpt" / "logs" / "metrics.jsonl").read_text().splitlines()]
    first = sum(r["critic/score/mean"] for r in rows[:3]) / 3
    last = sum(r["critic/score/mean"] for r in rows[-3:]) / 3
    assert first < 0.5, first
    assert last > 0.9, [round(r["critic/score/mean"], 3) for r in rows]
    print("score per step:", [round(r["critic/score/mean"], 2) for r in rows])

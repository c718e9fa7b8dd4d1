"""GRPO on a tiny random model learns a trivially learnable reward (about 15 s: kept in the fast tier), and the
same run learns on a GPU (``make test-gpu``; gpu_check.sh's ``learn`` stage prints its curve)."""

import json

import pytest
import torch

from hybridflow.config import PPOConfig, load_config
from hybridflow.trainer.main_ppo import run_ppo
from tests.trainer.ppo_fixtures import base_overrides


def _digit_scores(tmp_path, tiny_model_dir, *extra: str) -> list[float]:
    """``critic/score/mean`` per step of 60 GRPO steps whose reward is the fraction of the response's characters
    that are digits (chance ~0.2 for the random model)."""
    overrides = base_overrides(tmp_path, tiny_model_dir, steps=60) + [
        "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16", "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.actor.optim.lr=3e-3", "trainer.logger=[file]", *extra,
    ]
    run_ppo(load_config(PPOConfig, overrides))
    rows = [json.loads(x) for x in (tmp_path / "ckpt" / "logs" / "metrics.jsonl").read_text().splitlines()]
    return [r["critic/score/mean"] for r in rows]


def _assert_learned(scores: list[float]) -> None:
    first, last = sum(scores[:3]) / 3, sum(scores[-3:]) / 3
    print("score per step:", [round(s, 2) for s in scores])
    assert first < 0.5, first
    assert last > 0.9, [round(s, 3) for s in scores]


def test_grpo_learns_to_emit_digits(tmp_path, tiny_model_dir):
    _assert_learned(_digit_scores(tmp_path, tiny_model_dir))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_grpo_learns_to_emit_digits_on_cuda(tmp_path, tiny_model_dir):
    """Issue 47: the colocated loop (native engine, actor, reference) on ``cuda`` learns as on the CPU."""
    _assert_learned(_digit_scores(tmp_path, tiny_model_dir, "trainer.device=cuda"))

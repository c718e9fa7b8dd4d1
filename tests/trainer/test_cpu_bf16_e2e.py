"""GRPO on a CPU in bf16 (issue 62: ``HYBRIDFLOW_CPU_BF16=1``, what an AVX-512-BF16 / AMX CPU gets by default): what
holds in fp32 holds here: resume is bit for bit, master weights and checkpoints stay fp32, and the engine's and the
trainer's probabilities of the sampled tokens stay within a bound (both compute in bf16)."""

from __future__ import annotations

import pytest
import torch

from hybridflow.cpu import CPU_BF16_ENV
from tests.trainer.ppo_fixtures import base_overrides
from tests.trainer.test_ppo_e2e import read_metrics, resume_from_a_step_1_copy

LOG_PROB_GAP_BOUND = 0.01
"""Mean |log p_engine - log p_trainer| over sampled tokens: bf16's 8-bit mantissa, 2^-8 ~ 0.004 relative rounding of
each logit (measured 4e-4 to 6e-4 on the tiny model; 1e-7 with both in fp32)."""
FP32_GAP = 1e-5
"""Above this the run really computed in bf16 (fp32 on both sides measures ~1e-7)."""


def _overrides(root, model_dir):
    return base_overrides(root, model_dir, steps=2) + ["trainer.save_freq=1", "trainer.logger=[file]"]


def test_bf16_grpo_resumes_bit_for_bit_with_fp32_checkpoints_and_bounded_rollout_difference(
        tmp_path, tiny_model_dir, monkeypatch):
    from tests.trainer.test_ppo_e2e import merged_weights

    monkeypatch.setenv(CPU_BF16_ENV, "1")
    straight, _ = resume_from_a_step_1_copy(tmp_path, lambda root: _overrides(root, tiny_model_dir))
    weights = merged_weights(straight / "ckpt" / "global_step_2" / "actor", tmp_path / "merged")
    assert {tensor.dtype for tensor in weights.values()} == {torch.float32}  # fp32 master weights
    rows = read_metrics(straight)
    for row in rows:
        assert torch.isfinite(torch.tensor(row["actor/grad_norm"])) and row["actor/grad_norm"] > 0
        assert FP32_GAP < row["training/rollout_log_probs_diff_mean"] < LOG_PROB_GAP_BOUND, row
        assert row["training/rollout_probs_diff_max"] < LOG_PROB_GAP_BOUND, row


@pytest.mark.parametrize("override", ["actor_rollout_ref.rollout.dtype=float32"])
def test_bf16_training_with_an_fp32_engine_is_still_bounded(tmp_path, tiny_model_dir, monkeypatch, override):
    """A user's fp32 engine under the bf16 update: the two differ by the update's bf16 rounding only."""
    from hybridflow.config import PPOConfig, load_config
    from hybridflow.trainer.main_ppo import run_ppo

    monkeypatch.setenv(CPU_BF16_ENV, "1")
    run_ppo(load_config(PPOConfig, base_overrides(tmp_path, tiny_model_dir, steps=1) + [override,
                                                                                         "trainer.logger=[file]"]))
    row = read_metrics(tmp_path)[-1]
    assert FP32_GAP < row["training/rollout_log_probs_diff_mean"] < LOG_PROB_GAP_BOUND

"""Two GRPO steps with DeepSeek-V3 and GLM-4.5 rolled out by the native engine (issue 58), trained in the default
(shared-prompt, padding-free) layout: the rollout's and the trainer's probabilities of the sampled tokens agree to
fp32 rounding (verl's ``training/rollout_probs_diff_*``)."""

from __future__ import annotations

import json
import logging

import pytest

from hybridflow.config import PPOConfig, load_config
from hybridflow.trainer.main_ppo import run_ppo
from tests.models.non_native import save_non_native
from tests.trainer.ppo_fixtures import base_overrides


@pytest.mark.parametrize("arch", ["deepseek_v3", "glm4_moe"])
def test_two_grpo_steps_roll_out_natively_and_train_on_what_they_sample(tmp_path, arch, caplog, recwarn):
    model_dir = save_non_native(str(tmp_path / arch), arch)
    with caplog.at_level(logging.WARNING):
        run_ppo(load_config(PPOConfig, base_overrides(tmp_path, model_dir, steps=2)))
    rows = [json.loads(line) for line in (tmp_path / "ckpt" / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2] and all(row["actor/grad_norm"] > 0 for row in rows)
    assert not [str(w.message) for w in recwarn if "through HF generate" in str(w.message)]  # the native engine
    assert "layout differs" not in caplog.text  # the default layout ran
    assert all(row["training/rollout_probs_diff_max"] <= 1e-6 for row in rows)

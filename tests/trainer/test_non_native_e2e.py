"""One GRPO step over architectures outside the native engine's table (issue 58): they roll out through HF generate
(one warning) and train in the default (shared-prompt) layout, which the layout guard keeps only where it equals the
model's padded forward, so the rollout's and the trainer's probabilities of the sampled tokens agree to fp32
rounding (verl's ``training/rollout_probs_diff_*``)."""

from __future__ import annotations

import json
import logging

import pytest

from hybridflow.config import PPOConfig, load_config
from hybridflow.trainer.main_ppo import run_ppo
from tests.models.non_native import save_non_native
from tests.trainer.ppo_fixtures import base_overrides


@pytest.mark.parametrize("arch", ["granite", "smollm3"])
def test_one_grpo_step_trains_on_the_function_it_samples_from(tmp_path, arch, caplog, recwarn):
    model_dir = save_non_native(str(tmp_path / arch), arch)
    with caplog.at_level(logging.WARNING):
        run_ppo(load_config(PPOConfig, base_overrides(tmp_path, model_dir, steps=1)))
    rows = [json.loads(line) for line in (tmp_path / "ckpt" / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1] and rows[0]["actor/grad_norm"] > 0
    assert [w for w in recwarn if "through HF generate" in str(w.message)]  # the fallback engine rolled out
    assert "layout differs" not in caplog.text  # the default layout ran
    assert rows[0]["training/rollout_probs_diff_max"] <= 1e-6
    assert rows[0]["training/rollout_probs_diff_mean"] <= 1e-7

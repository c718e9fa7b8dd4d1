"""A run whose scoring fails says so on the console, and stops when nothing could be scored."""

from __future__ import annotations

import logging
import math
import os

import pandas as pd

from hybridflow.config import PPOConfig, load_config
from hybridflow.trainer.roles import assembly
from hybridflow.trainer.main_ppo import main, run_ppo
from tests.trainer.ppo_fixtures import base_overrides

ALWAYS_RAISES = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    raise KeyError("answer")
'''


def _raising_reward(tmp_path) -> str:
    path = tmp_path / "raising_reward.py"
    path.write_text(ALWAYS_RAISES)
    return f"custom_reward_function.path={path}"


def test_every_sample_failing_stops_the_run_with_one_line(tmp_path, tiny_model_dir, capsys):
    overrides = base_overrides(tmp_path, tiny_model_dir, steps=2) + [_raising_reward(tmp_path)]
    assert main(overrides) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hybridflow: error:")]
    assert len(errors) == 1
    assert "every sample failed to score: 8 of 8 samples failed" in errors[0]
    assert "KeyError: 'answer'" in errors[0] and "reward_model.stop_when_all_fail=false" in errors[0]


def test_keep_going_when_asked_prints_one_line_per_step(tmp_path, tiny_model_dir, caplog):
    overrides = base_overrides(tmp_path, tiny_model_dir, steps=2) + [
        _raising_reward(tmp_path), "reward_model.stop_when_all_fail=false"]
    with caplog.at_level(logging.WARNING, logger="hybridflow.workers.reward"):
        run = run_ppo(load_config(PPOConfig, overrides))
    lines = [r.getMessage() for r in caplog.records if r.name == "hybridflow.workers.reward"]
    assert run.steps == 2 and len(lines) == 2
    assert all(line.startswith("reward: 8 of 8 samples failed to score this step") for line in lines)


ABSURD_ON_ODD_ROWS = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1e300 if extra_info["index"] % 2 else 0.5
'''


def test_an_absurd_reward_is_a_failed_sample_and_the_update_runs(tmp_path, tiny_model_dir, caplog):
    """Issue 50: 1e300 became inf in float32, the score mean inf, the loss NaN, and the update was skipped
    without a word. Now those samples fail (failure_score, counted, one line a step) and the update runs."""
    path = tmp_path / "absurd_reward.py"
    path.write_text(ABSURD_ON_ODD_ROWS)
    overrides = base_overrides(tmp_path, tiny_model_dir, steps=1) + [f"custom_reward_function.path={path}"]
    with caplog.at_level(logging.WARNING):
        run = run_ppo(load_config(PPOConfig, overrides))
    metrics = run.history[-1]
    assert metrics["reward/num_failed"] == 4 and metrics["critic/score/mean"] == 0.25  # 4 x 0.5 + 4 x 0.0
    assert all(math.isfinite(metrics[key]) for key in ("actor/pg_loss", "actor/grad_norm"))
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("reward: 4 of 8 samples failed to score this step (first: digits: ScoreValueError: "
                            "score is 1e+300, beyond +-1e+16") for m in messages)
    assert not any("update skipped" in m for m in messages)


def test_misspelled_data_source_stops_before_any_model_loads(tmp_path, tiny_model_dir, capsys, monkeypatch):
    overrides = [o for o in base_overrides(tmp_path, tiny_model_dir) if not o.startswith("custom_reward_function")]
    train = tmp_path / "data" / "train.parquet"
    rows = pd.read_parquet(train)
    rows["data_source"] = "openai/gsm8kk"
    rows.to_parquet(train)

    def no_models(*args, **kwargs):
        raise AssertionError("models were loaded before the data was checked")

    monkeypatch.setattr(assembly, "build_worker_groups", no_models)
    assert main(overrides) == 2
    (error,) = capsys.readouterr().err.strip().splitlines()
    assert "data.train_files, row 0: no reward scorer for data_source 'openai/gsm8kk'" in error
    assert "did you mean 'openai/gsm8k'?" in error


# --------------------------------------------------------------------------- checkpoints on a full disk
def _on_small_disk(tmp_path, tiny_model_dir, small_disk) -> list[str]:
    overrides = base_overrides(tmp_path, tiny_model_dir, steps=2) + [
        "trainer.save_freq=1", "trainer.logger=[console]", f"trainer.default_local_dir={small_disk}"]
    return overrides


def test_full_disk_stops_the_run_and_keeps_the_last_checkpoint(tmp_path, tiny_model_dir, small_disk, capsys):
    assert main(_on_small_disk(tmp_path, tiny_model_dir, small_disk)) == 2
    (error,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hybridflow: error:")]
    assert f"disk full at {small_disk}: needs ~" in error and "MB free" in error
    assert sorted(os.listdir(small_disk)) == ["global_step_1", "latest_checkpointed_iteration.txt"]


def test_full_disk_keeps_training_when_asked(tmp_path, tiny_model_dir, small_disk, caplog):
    overrides = _on_small_disk(tmp_path, tiny_model_dir, small_disk) + ["trainer.stop_on_checkpoint_error=false"]
    with caplog.at_level(logging.WARNING, logger="hybridflow.trainer.loop.fit"):
        run = run_ppo(load_config(PPOConfig, overrides))
    assert run.steps == 2
    (line,) = [r.getMessage() for r in caplog.records if r.name == "hybridflow.trainer.loop.fit"]
    assert line.startswith("checkpoint of step 2 not saved, training on as asked: disk full at")
    assert not any(".tmp-" in name for name in os.listdir(small_disk))

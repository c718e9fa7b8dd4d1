"""Best-checkpoint selection and early stopping on the validation score (trainer.keep_best_checkpoint, ...)."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from hybridflow.config import PPOConfig, load_config
from hybridflow.errors import ConfigError
from hybridflow.trainer.checkpoints.best import BestCheckpoint, read_best_record, validation_score
from hybridflow.trainer.checkpoints.manager import complete_steps, save_checkpoint, step_dir
from hybridflow.trainer.main_ppo import run_ppo
from tests.trainer.ppo_fixtures import base_overrides


def test_validation_score_is_the_named_metric_or_the_mean_of_val_core():
    metrics = {"val-core/a/reward/mean@1": 0.2, "val-core/b/reward/mean@1": 0.6, "val-aux/a/reward/std@1": 9.0}
    assert validation_score(metrics, None) == pytest.approx(0.4)  # (0.2 + 0.6) / 2, val-aux ignored
    assert validation_score(metrics, "val-core/b/reward/mean@1") == 0.6
    assert validation_score({"actor/pg_loss": 1.0}, None) is None


def test_best_and_patience_by_hand():
    best = BestCheckpoint(metric="val", patience=2)
    # step: 0     10    20    30 (tie: not better)  40
    seq = [(0, 0.2), (10, 0.5), (20, 0.4), (30, 0.5), (40, 0.9)]
    improved = [best.observe({"val": v}, step=s) for s, v in seq[:4]]
    assert improved == [True, True, False, False]
    assert (best.best_step, best.best_value, best.validations_since_best) == (10, 0.5, 2)
    assert best.should_stop()  # 2 validations (20, 30) without a new best
    restored = BestCheckpoint(metric="val", patience=2)
    restored.load_state_dict(best.state_dict())
    assert restored.should_stop() and restored.best_step == 10
    assert "step 10" in best.describe()


def test_never_stops_without_patience_and_ignores_missing_scores():
    best = BestCheckpoint(metric=None, patience=0)
    assert best.observe({"actor/pg_loss": 0.1}, step=1) is False  # no validation at this step
    for step in range(5):
        best.observe({"val-core/x": 0.1}, step=step)
    assert not best.should_stop() and best.best_step == 0
    assert not BestCheckpoint(patience=1).observe({"val-core/x": math.nan}, step=1)


def test_rotation_never_deletes_the_protected_best(tmp_path):
    root = str(tmp_path)
    layer = torch.nn.Linear(2, 2)
    for step in (1, 2, 3, 4):
        save_checkpoint(root, step, {"actor": layer}, max_to_keep=1, protect=(step_dir(root, 1),))
    assert sorted(complete_steps(root)) == [1, 4]  # newest + protected; 2 and 3 rotated away


def _keep_best_run(tmp_path, model_dir, *extra: str):
    overrides = base_overrides(tmp_path, model_dir, steps=6) + [
        "trainer.test_freq=1", "trainer.val_before_train=True", "trainer.keep_best_checkpoint=True",
        "trainer.max_actor_ckpt_to_keep=1", "trainer.save_freq=-1", "actor_rollout_ref.actor.optim.lr=5e-3", *extra]
    run_ppo(load_config(PPOConfig, overrides))
    rows = [json.loads(line) for line in (tmp_path / "ckpt" / "logs" / "metrics.jsonl").read_text().splitlines()]
    key = "val-core/digits/reward/mean@1"
    return rows, [(r["step"], r[key]) for r in rows if key in r]


def test_keep_best_checkpoint_saves_and_names_the_best_validated_step(tmp_path, tiny_model_dir):
    rows, scores = _keep_best_run(tmp_path, tiny_model_dir)
    assert [s for s, _ in scores] == [0, 1, 2, 3, 4, 5, 6]
    best_step = max(scores, key=lambda sv: (sv[1], -sv[0]))[0]  # highest score, earliest on ties
    record = read_best_record(str(tmp_path / "ckpt"))
    if best_step == 0:  # training never beat the base model: nothing kept
        assert record is None
        return
    assert record.step == best_step and record.value == pytest.approx(dict(scores)[best_step])
    kept = complete_steps(str(tmp_path / "ckpt"))
    assert best_step in kept and os.path.abspath(kept[best_step]) == os.path.abspath(record.path)
    # with max_actor_ckpt_to_keep=1 only the newest save survives beside the protected best
    assert len(kept) <= 2


def test_early_stop_after_patience_validations_without_a_new_best(tmp_path, tiny_model_dir):
    rows, scores = _keep_best_run(tmp_path, tiny_model_dir, "trainer.early_stop_patience=1",
                                  "actor_rollout_ref.actor.optim.lr=5e-2")
    best, stop_step = -math.inf, None
    for step, value in scores:  # patience 1: the first validation that is not a new best stops the run
        if value > best:
            best = value
        else:
            stop_step = step
            break
    assert rows[-1]["step"] == (stop_step if stop_step is not None else 6)


@pytest.mark.parametrize("extra, fragment", [
    (["trainer.keep_best_checkpoint=True", "trainer.test_freq=-1"], "no validation runs"),
    (["trainer.early_stop_patience=-1"], "early_stop_patience=-1"),
    (["trainer.best_metric=actor/pg_loss"], "is not a validation metric"),
])
def test_bad_best_checkpoint_settings_are_named(tmp_path, tiny_model_dir, extra, fragment):
    from hybridflow.config.validate import validate_ppo_config

    cfg = load_config(PPOConfig, base_overrides(tmp_path, tiny_model_dir) + extra)
    with pytest.raises(ConfigError, match=fragment):
        validate_ppo_config(cfg)

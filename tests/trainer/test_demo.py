"""The demo entry point: the tiny preset end to end (shortened here; `make demo` runs the real one)."""

import pytest

from hybridflow.cli import main
from hybridflow.trainer.demo import PRESETS, before_after, report, run_demo


def test_tiny_demo_runs_and_reports_before_after(tmp_path, capsys):
    assert main(["demo", "--preset", "tiny", "--out", str(tmp_path / "run"), "trainer.total_training_steps=3",
                 "trainer.test_freq=3"]) == 0
    out = capsys.readouterr().out
    assert "[demo] held-out val-core/hybridflow/digits/reward/mean@1:" in out
    assert (tmp_path / "run" / "plots" / "reward.png").exists()
    assert (tmp_path / "run" / "data" / "test.parquet").exists()


@pytest.mark.slow
def test_tiny_demo_learns(tmp_path):
    result = run_demo("tiny", str(tmp_path / "run"), [])
    assert result["before"] < 0.5 and result["after"] > 0.9


def test_before_after_reads_the_first_and_last_validation():
    history = [{"step": 0, "val-core/x/reward/mean@1": 0.25}, {"step": 1, "critic/score/mean": 0.5},
               {"step": 2, "val-core/x/reward/mean@1": 0.75}]
    assert before_after(history) == ("val-core/x/reward/mean@1", 0.25, 0.75)
    assert set(PRESETS) == {"default", "tiny"}  # the experiment presets are benchmarks/demo_presets.py's


def test_report_names_the_best_validation_when_the_run_ended_below_it(capsys):
    key = "val-core/x/reward/mean@1"
    history = [{"step": 0, key: 0.1}, {"step": 10, key: 0.3}, {"step": 20, key: 0.3}, {"step": 30, key: 0.2}]
    result = report(history, steps=30, seconds=60)
    assert (result["best_step"], result["best"]) == (10, 0.3)  # the first of equal scores
    assert "best held-out val-core/x/reward/mean@1: 0.300 at step 10" in capsys.readouterr().out
    assert "best" not in report(history[:3], steps=20, seconds=60)  # the last is the best


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_a_valid_config(tmp_path, name):
    from hybridflow.config import PPOConfig, load_config
    from hybridflow.trainer.demo import demo_overrides

    overrides = demo_overrides(PRESETS[name], model="m", train="t.parquet", test="v.parquet", run_dir=str(tmp_path))
    cfg = load_config(PPOConfig, overrides)
    assert cfg.trainer.total_training_steps > 0


def test_a_preset_can_keep_its_held_out_questions_as_drawn(tmp_path):
    """``test_as_drawn``: the held-out draws all stay (the default keeps only those training never drew)."""
    from dataclasses import replace

    import pandas as pd

    from hybridflow.trainer.demo import prepare_data

    def sizes(preset, folder):
        train, test = (pd.read_parquet(path) for path in prepare_data(preset, str(tmp_path / folder)))
        questions = [row[0]["content"] for row in test["prompt"]]
        assert not set(questions) & {row[0]["content"] for row in train["prompt"]}
        return len(train), len(questions)

    preset = replace(PRESETS["default"], train_size=128, test_size=40)  # ~200 distinct questions: overlap is sure
    default_train, default_test = sizes(preset, "default")
    drawn_train, drawn_test = sizes(replace(preset, test_as_drawn=True), "drawn")
    assert default_train == 128 and default_test < drawn_test
    assert drawn_train < 128 and drawn_test > 30


def test_an_experiment_preset_names_where_it_runs(capsys):
    assert main(["demo", "--preset", "tools"]) == 2
    err = capsys.readouterr().err
    assert "--preset tools: hybridflow demo runs default or tiny" in err
    assert "python benchmarks/demo_presets.py --preset NAME" in err


@pytest.mark.parametrize("bf16_cpu, extra, engine_log_probs", [
    ("0", [], True),  # an AVX2-only CPU: fp32 engine and trainer agree to ~1e-9, no recomputing forward
    ("1", [], False),  # bf16 both sides: the trainer recomputes the old log-probs (verl's default)
    ("1", ["actor_rollout_ref.actor.fsdp_config.mixed_precision=fp32", "actor_rollout_ref.rollout.dtype=float32"], True),
    ("1", ["actor_rollout_ref.actor.fsdp_config.mixed_precision=fp32"], False),  # bf16 engine, fp32 trainer
    ("0", ["actor_rollout_ref.actor.fsdp_config.mixed_precision=bf16"], False),
    ("0", ["trainer.device=cuda"], False),
])
def test_the_demo_takes_the_engines_log_probs_only_where_they_equal_the_trainers(tmp_path, monkeypatch, bf16_cpu,
                                                                                 extra, engine_log_probs):
    from hybridflow.trainer.demo import ENGINE_LOG_PROBS, demo_overrides, old_log_prob_overrides

    monkeypatch.setenv("HYBRIDFLOW_CPU_BF16", bf16_cpu)
    overrides = demo_overrides(PRESETS["default"], model="m", train="t.parquet", test="v.parquet",
                               run_dir=str(tmp_path)) + extra
    assert old_log_prob_overrides(overrides) == ([ENGINE_LOG_PROBS] if engine_log_probs else [])

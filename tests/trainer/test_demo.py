"""The demo entry point: the tiny preset end to end (shortened here; `make demo` runs the real one)."""

import pytest

from hybridflow.cli import main
from hybridflow.trainer.demo import PRESETS, before_after, run_demo


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
    assert set(PRESETS) == {"default", "tiny"}

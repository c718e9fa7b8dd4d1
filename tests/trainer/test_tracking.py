"""Tracking backends, the end-of-run summary table and the training-curve PNGs."""

import json
import os
import sys

import numpy as np
import pytest
import torch

from hybridflow.errors import ConfigError
from hybridflow.trainer.tracking.plots import Curve, fixed_keys, plot_curves
from hybridflow.trainer.tracking.summary import summary_table
from hybridflow.trainer.tracking.trackers import (
    Tracking,
    available_backends,
    format_console_line,
    mlflow_metric_name,
    wandb_mode,
)


def step_metrics(step: int) -> dict[str, float]:
    return {
        "critic/score/mean": 0.1 * step,
        "response_length/mean": 20.0 + step,
        "actor/pg_loss": -0.01 * step,
        "actor/entropy": 2.0 - 0.1 * step,
        "actor/ppo_kl": 0.001 * step,
        "timing_s/step": 2.0,
        "perf/total_num_tokens": 100.0 * step,
    }


def test_file_backend_writes_one_flushed_jsonl_line_per_step_and_appends(tmp_path):
    tracking = Tracking("proj", "exp", ["file"], config={"a": 1}, local_dir=str(tmp_path))
    tracking.log({"critic/score/mean": 0.5, "val-core/gsm8k/reward/mean@4": np.float32(0.25)}, step=1)
    tracking.log({"critic/score/mean": torch.tensor(0.75)}, step=2)
    path = tmp_path / "metrics.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]  # readable before finish(): flushed
    assert lines == [
        {"step": 1, "critic/score/mean": 0.5, "val-core/gsm8k/reward/mean@4": 0.25},
        {"step": 2, "critic/score/mean": 0.75},
    ]
    tracking.finish()
    resumed = Tracking("proj", "exp", "file", local_dir=str(tmp_path))
    resumed.log({"critic/score/mean": 1.0}, step=3)
    resumed.finish()
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]


def test_a_resume_starts_the_history_with_the_logged_steps_and_the_file_holds_each_step_once(tmp_path):
    """Resumed from step 2's checkpoint after steps 3-4 were logged and a crash tore the next line: the
    history (the summary's and the plots' source) holds steps 1-2 before this process's own, the file drops
    3-4 to metrics.superseded.jsonl (the resumed run logs them again) and the torn line."""
    rows = [{"step": step, "critic/score/mean": step / 10} for step in range(5)]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows) + '{"step": 5, "critic/sc')
    tracking = Tracking("proj", "exp", ["console", "file"], local_dir=str(tmp_path))
    tracking.resume_at(2)
    tracking.log({"critic/score/mean": 0.33}, step=3)
    tracking.finish()
    assert [row["step"] for row in tracking.history] == [0, 1, 2, 3]
    assert tracking.history[:3] == rows[:3]
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1, 2, 3]
    superseded = [json.loads(line) for line in (tmp_path / "metrics.superseded.jsonl").read_text().splitlines()]
    assert superseded == rows[3:]


def test_a_torn_line_alone_is_dropped_so_the_next_row_starts_on_its_own_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 0.1}\n{"step": 2, "x')  # killed mid-write of step 2's row
    tracking = Tracking("proj", "exp", ["file"], local_dir=str(tmp_path))
    tracking.resume_at(1)
    tracking.log({"x": 0.2}, step=2)
    tracking.finish()
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"step": 1, "x": 0.1}, {"step": 2, "x": 0.2}]
    assert not (tmp_path / "metrics.superseded.jsonl").exists()


def test_without_the_file_logger_a_resume_keeps_this_process_history():
    tracking = Tracking("p", "e", ["console"], local_dir="unused")
    tracking.resume_at(4)
    tracking.log({"x": 1.0}, step=5)
    assert tracking.history == [{"step": 5, "x": 1.0}]


def test_history_keeps_plain_floats():
    tracking = Tracking("p", "e", [], local_dir="unused")
    tracking.log({"x": np.float64(1.5), "y": torch.tensor(2.0)}, step=7)
    assert tracking.history == [{"step": 7, "x": 1.5, "y": 2.0}]
    assert all(type(v) is float for k, v in tracking.history[0].items() if k != "step")


def test_console_line_has_headline_metrics_in_order(capsys):
    line = format_console_line({"actor/entropy": 1.23456, "critic/score/mean": 0.5, "other": 9.0}, step=3)
    assert line == "step 3 | score 0.5 | entropy 1.235"
    tracking = Tracking("p", "e", ["console"], local_dir="unused")
    with tracking.progress(total_steps=5) as bar:
        tracking.log({"critic/score/mean": 0.25, "timing_s/step": 1.5}, step=2)
        assert bar.n == 2
    assert "step 2 | score 0.25 | step_s 1.5" in capsys.readouterr().out


def test_tensorboard_event_file_holds_the_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracking = Tracking("p", "e", ["tensorboard"], config={"lr": 1e-6}, local_dir=str(tmp_path))
    tracking.log({"critic/score/mean": 0.5}, step=1)
    tracking.log({"critic/score/mean": 0.75}, step=2)
    tracking.finish()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scalars = events.Scalars("critic/score/mean")
    assert [(e.step, e.value) for e in scalars] == [(1, 0.5), (2, 0.75)]


@pytest.mark.parametrize("package", ["wandb", "mlflow"])
def test_missing_optional_package_gives_install_hint(monkeypatch, package):
    monkeypatch.setitem(sys.modules, package, None)  # makes `import package` raise ImportError
    with pytest.raises(ConfigError) as error:
        Tracking("p", "e", [package], local_dir="unused")
    expected = (
        f"trainer.logger includes '{package}' but {package} is not installed: pip install 'hybridflow[{package}]'"
    )
    assert str(error.value) == expected


def test_unknown_backend_lists_choices():
    with pytest.raises(ConfigError, match=r"unknown trainer.logger backend\(s\) \['wandbb'\]; choose from \[.*'wandb'"):
        Tracking("p", "e", ["console", "wandbb"], local_dir="unused")
    assert {"console", "file", "tensorboard", "wandb", "swanlab", "mlflow"} <= set(available_backends())


def test_wandb_mode_and_mlflow_names():
    assert wandb_mode({}) == "offline"
    assert wandb_mode({"WANDB_API_KEY": "k"}) == "online"
    assert wandb_mode({"WANDB_API_KEY": "k", "WANDB_MODE": "disabled"}) == "disabled"
    assert mlflow_metric_name("val-core/gsm8k/reward/mean@4") == "val-core/gsm8k/reward/mean_at_4"


def test_wandb_offline_run_when_installed(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    tracking = Tracking("p", "e", ["wandb"], config={"lr": 1.0}, local_dir=str(tmp_path))
    tracking.log({"critic/score/mean": 0.5}, step=1)
    tracking.finish()
    assert any(name.startswith("offline-run") for name in os.listdir(tmp_path / "wandb"))


def test_swanlab_offline_run_when_installed(tmp_path, monkeypatch):
    """swanlab is an optional extra (pip install 'hybridflow[swanlab]'); offline without an API key."""
    pytest.importorskip("swanlab")
    monkeypatch.delenv("SWANLAB_API_KEY", raising=False)
    monkeypatch.delenv("SWANLAB_MODE", raising=False)
    tracking = Tracking("p", "e", ["swanlab"], config={"lr": 1.0}, local_dir=str(tmp_path))
    tracking.log({"critic/score/mean": 0.5}, step=1)
    tracking.log_generations([("1+1?", "2", 1.0)], step=1)
    tracking.finish()
    runs = [p for p in (tmp_path / "swanlog").iterdir() if p.is_dir()]
    assert len(runs) == 1
    records = b"".join(p.read_bytes() for p in runs[0].rglob("*.swanlab"))
    assert b"critic/score/mean" in records and b"val/generations" in records  # metrics and samples recorded


def test_swanlab_mode():
    from hybridflow.trainer.tracking.trackers import swanlab_mode

    assert swanlab_mode({}) == "offline"
    assert swanlab_mode({"SWANLAB_API_KEY": "k"}) == "cloud"
    assert swanlab_mode({"SWANLAB_API_KEY": "k", "SWANLAB_MODE": "disabled"}) == "disabled"


def test_validation_generations_reach_file_and_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracking = Tracking("p", "e", ["console", "file", "tensorboard"], local_dir=str(tmp_path))
    tracking.log_generations([("What is 1+1?", "2", 1.0), ("What is 2+2?", "5", 0.0)], step=3)
    tracking.finish()
    rows = [json.loads(line) for line in (tmp_path / "val_generations.jsonl").read_text().splitlines()]
    assert rows == [{"step": 3, "input": "What is 1+1?", "output": "2", "score": 1.0},
                    {"step": 3, "input": "What is 2+2?", "output": "5", "score": 0.0}]
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    text = events.Tensors("val/generations/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "What is 2+2?" in text and "**output:** 5" in text


def test_mlflow_local_store_when_installed(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")  # restored (unset) after the test ...
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")  # ... and absent during it, as on a user's machine
    tracking = Tracking("p", "e", ["mlflow"], config={"trainer": {"lr": 1.0}}, local_dir=str(tmp_path))
    tracking.log({"val-core/x/reward/mean@2": 0.5}, step=3)
    run_id = mlflow.active_run().info.run_id
    tracking.finish()
    history = mlflow.tracking.MlflowClient().get_metric_history(run_id, "val-core/x/reward/mean_at_2")
    assert [(m.step, m.value) for m in history] == [(3, 0.5)]


def test_summary_table_first_last_best_and_throughput():
    history = [{"step": s, **step_metrics(s)} for s in (1, 2, 3)]
    history[1]["critic/score/mean"] = 0.9  # the best score is in the middle
    history[2]["val-core/gsm8k/reward/mean@1"] = 0.4
    table = summary_table(history)
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines()[2:-1]}
    assert rows["critic/score/mean"] == [f"{0.1:.4g}", f"{0.3:.4g}", f"{0.9:.4g}"]
    assert rows["response_length/mean"] == ["21", "23", "-"]
    assert rows["val-core/gsm8k/reward/mean@1"] == ["0.4", "0.4", "0.4"]
    tokens_per_s = (100 + 200 + 300) / (3 * 2.0)
    assert table.splitlines()[-1] == f"steps 3 (1..3) | wall time 6.0 s | {tokens_per_s:.1f} tokens/s"
    assert summary_table([]) == "no steps logged"


def test_plot_curves_writes_pngs_and_skips_empty_curves(tmp_path):
    history = [{"step": s, **step_metrics(s)} for s in range(1, 6)]
    history[4]["val-core/gsm8k/reward/mean@1"] = 0.3
    paths = plot_curves(history, str(tmp_path / "plots"))
    names = sorted(os.path.basename(p) for p in paths)
    assert names == ["entropy.png", "kl.png", "response_length.png", "reward.png", "val_score.png"]
    for path in paths:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    only_reward = plot_curves([{"step": 1, "critic/score/mean": 0.5}], str(tmp_path / "few"))
    assert [os.path.basename(p) for p in only_reward] == ["reward.png"]


def test_summary_and_plots_take_another_trainers_metric_tables(tmp_path):
    history = [{"step": 1, "train/loss": 2.0, "train/lr": 1e-3, "critic/score/mean": 0.5},
               {"step": 2, "train/loss": 1.5, "train/lr": 5e-4},
               {"step": 3, "train/loss": 1.75}]
    table = summary_table(history, headlines={"train/loss": min, "train/lr": None})
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines()[2:-1]}
    assert rows == {"train/loss": ["2", "1.75", "1.5"], "train/lr": ["0.001", "0.0005", "-"]}  # PPO's rows gone
    assert table.splitlines()[-1] == "steps 3 (1..3)"
    curves = (Curve("loss.png", "Loss", "nats", fixed_keys("train/loss")),
              Curve("absent.png", "Absent", "-", fixed_keys("val/loss")))
    paths = plot_curves(history, str(tmp_path / "sft"), curves=curves)
    assert [os.path.basename(p) for p in paths] == ["loss.png"]


def test_console_line_shows_validation_scores_as_they_happen():
    # issue 59: the step-0 line was only `step 0`, validation steps carried no val-core value
    line = format_console_line({"val-core/chain_sum/reward/mean@1": 0.125, "val-aux/x/y": 3.0}, step=0)
    assert line == "step 0 | val-core/chain_sum/reward/mean@1 0.125"
    line = format_console_line({"critic/score/mean": 0.5, "val-core/b/reward/mean@1": 0.5,
                                "val-core/a/reward/mean@4": 0.25}, step=10)
    assert line == "step 10 | score 0.5 | val-core/a/reward/mean@4 0.25 | val-core/b/reward/mean@1 0.5"

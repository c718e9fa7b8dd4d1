"""The `hybridflow` command: config show / dump, models tiny, one-line errors."""

import os
import subprocess
import sys

import pytest

from hybridflow.cli import main


def test_config_show_prints_resolved_config(capsys):
    assert main(["config", "show", "data.train_batch_size=8", "algorithm.adv_estimator=grpo"]) == 0
    out = capsys.readouterr().out
    assert "  train_batch_size: 8\n" in out
    assert "  adv_estimator: grpo\n" in out
    assert "    response_length: 512\n" in out  # interpolation resolved


def test_config_show_misspelling_is_one_line(capsys):
    assert main(["config", "show", "data.train_batch_size=8", "algorithm.adv_estimater=grpo"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "hybridflow: error: unknown config key 'algorithm.adv_estimater' (from override "
        "'algorithm.adv_estimater=grpo'); did you mean 'algorithm.adv_estimator'?"
    )


def test_config_show_doc_and_sft(capsys):
    assert main(["config", "show", "--trainer", "sft", "--doc", "data.max_length=64"]) == 0
    out = capsys.readouterr().out
    assert "# Longest tokenised example (prompt + response).\n  max_length: 64\n" in out


def test_models_tiny_writes_a_loadable_model(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert main(["models", "tiny", str(tmp_path / "tiny"), "--arch", "qwen2"]) == 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "tiny")
    tok = AutoTokenizer.from_pretrained(tmp_path / "tiny")
    assert model.config.model_type == "qwen2" and tok.eos_token == "<|im_end|>"


def test_console_script_runs_as_subprocess():
    env = dict(os.environ, HYBRIDFLOW_DEBUG="")
    proc = subprocess.run([sys.executable, "-m", "hybridflow.cli", "config", "show", "algorithm.adv_estimater=grpo"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "did you mean 'algorithm.adv_estimator'" in proc.stderr


def test_preprocess_exits_zero_after_writing(tmp_path):
    # a script's main returns the written paths; the command must still exit 0, not print them and exit 1
    proc = subprocess.run([sys.executable, "-m", "hybridflow.cli", "preprocess", "reasoning_gym", "--task",
                           "chain_sum", "--size", "3", "--test_size", "1", "--local_save_dir", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "train.parquet").exists() and "{" not in proc.stderr


ENTRY_POINTS = [  # (module run as ``python -m``, its arguments, what the usage must point at)
    ("hybridflow.trainer.main_ppo", ["--help"], "hybridflow config show --doc"),
    ("hybridflow.trainer.sft_trainer", ["-h"], "hybridflow config show --trainer sft --doc"),
    ("hybridflow.trainer.fsdp_sft_trainer", ["--help"], "hybridflow config show --trainer sft --doc"),
    ("hybridflow.cli", ["ppo", "--help"], "hybridflow config show --doc"),
    ("hybridflow.cli", ["sft", "--help"], "hybridflow config show --trainer sft --doc"),
    ("hybridflow.model_merger", ["--help"], "hybridflow config show --doc"),
    # issue 37: these failed with "unknown option '--help'"
    ("hybridflow.trainer.main_spin", ["--help"], "hybridflow config show --trainer spin --doc"),
    ("hybridflow.trainer.main_sppo", ["--help"], "hybridflow config show --trainer sppo --doc"),
    ("hybridflow.cli", ["spin", "--help"], "hybridflow config show --trainer spin --doc"),
    ("hybridflow.cli", ["sppo", "-h"], "hybridflow config show --trainer sppo --doc"),
    ("hybridflow.trainer.main_dapo", ["--help"], "hybridflow config show --doc"),
    ("hybridflow.trainer.main_prime", ["--help"], "hybridflow config show --doc"),
]


@pytest.mark.parametrize("module, args, pointer", ENTRY_POINTS, ids=lambda x: x if isinstance(x, str) else None)
def test_every_entry_point_answers_help(module, args, pointer, monkeypatch, capsys):
    """``python -m MODULE --help``, run in-process through the module's ``__main__`` block."""
    import runpy

    monkeypatch.setattr(sys, "argv", [module, *args])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    out, err = capsys.readouterr()
    assert exit_.value.code in (0, None), err
    assert out.startswith("usage: ") and pointer in " ".join(out.split()) and err == ""


def test_preprocess_help_after_a_script_name_is_that_scripts_help():
    proc = subprocess.run([sys.executable, "-m", "hybridflow.cli", "preprocess", "reasoning_gym", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--task" in proc.stdout and "--local_save_dir" in proc.stdout

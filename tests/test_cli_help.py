"""Issue 59: each command's help names the command a user typed, and `models tiny` prints a path for `$(...)`."""

import subprocess
import sys

import pytest

from hybridflow.cli import main


@pytest.mark.parametrize("argv, usage", [
    (["merge", "--help"], "usage: hybridflow merge "),
    (["preprocess", "worked_sums", "--help"], "usage: hybridflow preprocess worked_sums "),
    (["preprocess", "gsm8k", "--help"], "usage: hybridflow preprocess gsm8k "),
    (["config", "show", "--help"], "usage: hybridflow config show "),
])
def test_help_names_the_command_typed(argv, usage, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and out.startswith(usage), out[:200]


def test_config_show_help_mentions_overrides(capsys):
    with pytest.raises(SystemExit):
        main(["config", "show", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "[key=value ...]" in out and "--config-path" in out and "overrides" in out


def test_models_tiny_module_help_has_no_runpy_warning():
    proc = subprocess.run([sys.executable, "-m", "hybridflow.models.tiny", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == "" and proc.stdout.startswith("usage: hybridflow models tiny")


def test_models_tiny_prints_only_the_path_on_stdout(tmp_path, capsys):
    target = str(tmp_path / "tiny")
    assert main(["models", "tiny", target]) == 0
    out, err = capsys.readouterr()
    assert out == target + "\n"  # MODEL=$(hybridflow models tiny DIR) gets the folder
    assert "tiny random llama model" in err

"""verl 0.9.1 keys and command-line rules of issue 60 (besides distillation: tests/trainer/test_distillation_e2e.py)."""

import os

import pytest

from hybridflow.config import split_config_args
from hybridflow.config.loader import ENTRY_MODULE_DIR, SHIPPED_CONFIG_DIR


@pytest.mark.parametrize("name", ["ppo_trainer", "fully_async_ppo_trainer", "sft_trainer"])
def test_relative_config_path_resolves_beside_the_entry_module_not_the_working_directory(tmp_path, monkeypatch, name):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / f"{name}.yaml").write_text("data: {train_batch_size: 3}\n")  # a decoy in the cwd
    monkeypatch.chdir(tmp_path)
    config_file, rest = split_config_args(["--config-path=config", f"--config-name={name}", "a=1"])
    assert config_file == os.path.join(SHIPPED_CONFIG_DIR, f"{name}.yaml") and rest == ["a=1"]


def test_a_folder_beside_the_entry_module_wins_and_a_user_folder_still_reads(tmp_path, monkeypatch):
    assert os.path.basename(ENTRY_MODULE_DIR) == "trainer"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "run.yaml").write_text("{}\n")
    monkeypatch.chdir(tmp_path)
    config_file, _ = split_config_args(["--config-path", "mine", "--config-name", "run"])
    assert config_file == os.path.join("mine", "run.yaml")

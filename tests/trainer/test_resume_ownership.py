"""A run never resumes from or writes over checkpoints it did not make (issue 61).

Before: a GRPO run's folder resumed with ``adv_estimator=gae`` (a critic now needed) said "checkpoint is
damaged (component 'critic' is missing) ... starting fresh", trained, and overwrote ``global_step_1`` and
``global_step_2``; a finished 2-step run resumed with ``total_training_steps=1`` said nothing.
"""

import os

import pytest

from hybridflow.config import PPOConfig, load_config
from hybridflow.errors import ConfigError
from hybridflow.trainer.checkpoints.manager import damage
from hybridflow.trainer.main_ppo import run_ppo
from tests.trainer.ppo_fixtures import base_overrides


def folder_state(root) -> dict[str, float]:
    """Every file under ``root`` with its modification time: what "nothing touched" compares."""
    return {os.path.join(d, n): os.stat(os.path.join(d, n)).st_mtime_ns for d, _, names in os.walk(root) for n in names}


@pytest.fixture
def grpo_folder(tmp_path, tiny_model_dir):
    overrides = base_overrides(tmp_path, tiny_model_dir, steps=2) + ["trainer.save_freq=1", "trainer.logger=[file]",
                                                                     "trainer.val_before_train=false"]
    run_ppo(load_config(PPOConfig, overrides))
    return tmp_path / "ckpt", overrides


def test_another_configurations_checkpoints_are_refused_and_left_untouched(grpo_folder):
    root, overrides = grpo_folder
    before = folder_state(root)
    with pytest.raises(ConfigError) as refused:
        run_ppo(load_config(PPOConfig, overrides + ["algorithm.adv_estimator=gae"]))
    message = str(refused.value)
    assert "\n" not in message and "another configuration" in message and "critic" in message
    assert "trainer.start_over=true" in message
    assert folder_state(root) == before
    assert damage(str(root / "global_step_2")) is None  # not damaged: another run's


def test_the_same_components_under_another_estimator_are_refused(grpo_folder):
    root, overrides = grpo_folder
    before = folder_state(root)
    with pytest.raises(ConfigError, match="algorithm.adv_estimator='grpo'.*'rloo'"):
        run_ppo(load_config(PPOConfig, overrides + ["algorithm.adv_estimator=rloo"]))
    assert folder_state(root) == before


def test_resume_disabled_into_a_folder_with_checkpoints_is_refused(grpo_folder):
    root, overrides = grpo_folder
    before = folder_state(root)
    with pytest.raises(ConfigError, match="resume_mode=disable.*write over"):
        run_ppo(load_config(PPOConfig, overrides + ["trainer.resume_mode=disable"]))
    assert folder_state(root) == before


def test_start_over_deletes_the_old_run_and_trains_fresh(grpo_folder):
    root, overrides = grpo_folder
    run = run_ppo(load_config(PPOConfig, overrides + ["algorithm.adv_estimator=gae", "trainer.start_over=true",
                                                      "trainer.total_training_steps=1"]))  # fmt: skip
    assert run.resumed_from == 0 and run.steps == 1
    assert sorted(p for p in os.listdir(root) if p.startswith("global_step_")) == ["global_step_1"]
    assert {"actor", "critic"} <= set(os.listdir(root / "global_step_1"))


def test_a_finished_run_resumed_with_fewer_steps_says_so(grpo_folder, capsys):
    root, overrides = grpo_folder
    capsys.readouterr()
    run = run_ppo(load_config(PPOConfig, overrides + ["trainer.total_training_steps=1"]))
    out = capsys.readouterr().out
    assert run.resumed_from == 2
    lines = [line for line in out.splitlines() if "nothing to train" in line]
    assert len(lines) == 1 and "step 2" in lines[0] and "trainer.total_training_steps" in lines[0]

"""A resumed PPO run says on the console which checkpoint and step it continues from (issue 37: it said nothing)."""

from hybridflow.config import PPOConfig, load_config
from hybridflow.trainer.main_ppo import run_ppo
from tests.trainer.ppo_fixtures import base_overrides


def test_a_resumed_run_says_its_step(tmp_path, tiny_model_dir, capsys):
    overrides = base_overrides(tmp_path, tiny_model_dir, steps=1) + ["trainer.save_freq=1", "trainer.logger=[file]"]
    run_ppo(load_config(PPOConfig, overrides))
    assert "resumed from" not in capsys.readouterr().out
    run = run_ppo(load_config(PPOConfig, overrides + ["trainer.total_training_steps=2"]))
    assert run.resumed_from == 1
    assert f"hybridflow: resumed from {tmp_path / 'ckpt' / 'global_step_1'} at step 1" in capsys.readouterr().out

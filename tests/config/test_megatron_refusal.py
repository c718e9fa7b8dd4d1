"""Issue 59: `strategy=megatron` is one line (it was a "has no effect" warning and then an error per role)."""

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("argv, named", [
    (["hybridflow.trainer.main_ppo", "actor_rollout_ref.actor.strategy=megatron"], "actor_rollout_ref.actor.strategy"),
    (["hybridflow.trainer.main_ppo", "actor_rollout_ref.actor.fsdp_config.strategy=megatron"],  # verl 0.9's spelling
     "actor_rollout_ref.actor.strategy"),
    (["hybridflow.trainer.sft_trainer", "model.strategy=megatron"], "model.strategy"),
])
def test_megatron_strategy_is_refused_in_one_line(argv, named, tmp_path):
    env = dict(os.environ, HYBRIDFLOW_DEBUG="")
    proc = subprocess.run([sys.executable, "-m", *argv, "actor_rollout_ref.model.path=/no/model"
                           if "main_ppo" in argv[0] else "model.partial_pretrain=/no/model"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "Megatron-LM is not supported" in lines[0] and f"{named}=megatron: " in lines[0]

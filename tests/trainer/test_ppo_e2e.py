"""End-to-end PPO / GRPO runs on a tiny model: every estimator, metrics, resume after SIGKILL, export."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from hybridflow.algos import list_advantages
from hybridflow.config import PPOConfig, load_config
from hybridflow.errors import ConfigError
from hybridflow.trainer.main_ppo import main, run_ppo
from tests.trainer.ppo_fixtures import base_overrides

VERL_METRICS = [
    "critic/score/mean", "critic/score/max", "critic/score/min", "critic/rewards/mean", "critic/advantages/mean",
    "critic/returns/mean", "actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy",
    "actor/grad_norm", "actor/lr", "response_length/mean", "response_length/max", "response_length/min",
    "response_length/clip_ratio", "prompt_length/mean", "timing_s/gen", "timing_s/reward", "timing_s/old_log_prob",
    "timing_s/adv", "timing_s/update_actor", "timing_s/step", "perf/total_num_tokens", "perf/time_per_step",
    "perf/throughput", "training/rollout_probs_diff_mean",
]


def read_metrics(tmp_path) -> list[dict]:
    path = tmp_path / "ckpt" / "logs" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_grpo_run_logs_verl_metric_names(tmp_path, tiny_model_dir):
    run_ppo(load_config(PPOConfig, base_overrides(tmp_path, tiny_model_dir)))
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    missing = [name for name in VERL_METRICS if name not in rows[-1]]
    assert not missing, missing
    assert (tmp_path / "ckpt" / "plots" / "reward.png").exists()


def test_ppo_with_critic_and_kl(tmp_path, tiny_model_dir):
    overrides = base_overrides(tmp_path, tiny_model_dir, estimator="gae") + [
        "algorithm.use_kl_in_reward=True", "algorithm.kl_ctrl.type=adaptive",
        "actor_rollout_ref.actor.use_kl_loss=True", "trainer.test_freq=2",
    ]
    run_ppo(load_config(PPOConfig, overrides))
    last = read_metrics(tmp_path)[-1]
    for name in ("critic/vf_loss", "critic/vf_explained_var", "critic/values/mean", "timing_s/values",
                 "timing_s/update_critic", "timing_s/ref", "actor/kl_loss", "actor/reward_kl_penalty",
                 "val-core/digits/reward/mean@1"):
        assert name in last, name


@pytest.mark.parametrize("estimator", sorted(set(list_advantages()) - {"gae", "grpo"}))
def test_every_estimator_runs_a_step(tmp_path, tiny_model_dir, estimator):
    run_ppo(load_config(PPOConfig, base_overrides(tmp_path, tiny_model_dir, estimator=estimator, steps=1)))
    last = read_metrics(tmp_path)[-1]
    assert torch.isfinite(torch.tensor(last["actor/pg_loss"]))


def test_bad_model_path_is_one_line(tmp_path, tiny_model_dir, capsys):
    overrides = base_overrides(tmp_path, tiny_model_dir) + [f"actor_rollout_ref.model.path={tmp_path / 'nope'}"]
    assert main(overrides) == 2
    assert f"actor_rollout_ref.model.path: model folder '{tmp_path / 'nope'}' does not exist" in capsys.readouterr().err


def test_unknown_estimator_lists_registered(tmp_path, tiny_model_dir):
    overrides = base_overrides(tmp_path, tiny_model_dir, estimator="grpoo")
    with pytest.raises(ConfigError, match="grpo"):
        run_ppo(load_config(PPOConfig, overrides))


# ---------------------------------------------------------------------------- resume after SIGKILL
SLOW_REWARD = '''
import time
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep(0.15)  # slows each step so the test can kill the process mid-run
    return float(sum(ch.isdigit() for ch in solution_str)) / max(len(solution_str), 1)
'''


def _run_cli(overrides: list[str], *, kill_after_checkpoint: str | None = None) -> int:
    cmd = [sys.executable, "-m", "hybridflow.trainer.main_ppo", *overrides]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    if kill_after_checkpoint is None:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err.decode()[-3000:]
        return proc.returncode
    deadline = time.time() + 600
    while not os.path.exists(kill_after_checkpoint) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return proc.returncode


def test_resume_after_sigkill_is_bitwise_equal(tmp_path, tiny_model_dir):
    reward = tmp_path / "slow_reward.py"
    reward.write_text(SLOW_REWARD)

    def overrides(root):
        return base_overrides(root, tiny_model_dir, steps=4) + [
            f"custom_reward_function.path={reward}", "trainer.save_freq=2", "trainer.logger=[file]",
            "data.shuffle=True"]

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    _run_cli(overrides(straight))
    tracker = resumed / "ckpt" / "latest_checkpointed_iteration.txt"
    assert _run_cli(overrides(resumed), kill_after_checkpoint=str(tracker)) == -signal.SIGKILL
    assert tracker.read_text().strip() == "2"
    assert not (resumed / "ckpt" / "global_step_4").exists()
    _run_cli(overrides(resumed))
    a = load_file(straight / "ckpt" / "global_step_4" / "actor" / "model.safetensors")
    b = load_file(resumed / "ckpt" / "global_step_4" / "actor" / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key

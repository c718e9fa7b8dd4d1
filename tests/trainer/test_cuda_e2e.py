"""The PPO trainer on CUDA (marked ``gpu``: run with ``make test-gpu`` on a machine with a GPU), and the
same configurations on the CPU in the default tier.

The CPU tier runs every configuration below on the CPU, where every tensor shares one device, so a
tensor built on the CPU and combined with the batch (which the trainer moves to ``trainer.device`` after
each rollout) goes unnoticed there. These runs put the model, the engine and the batch on ``cuda:0``:
a CPU-built score, index or generator meeting a CUDA tensor raises here. The first of them found the
reward placement doing exactly that (2026-11-26, H100; 25 passed there after the fixes). The async, self-play
and multi-turn tests at the end were added after that session: they have run on the CPU only so far.
"""

from __future__ import annotations

import pytest
import torch

from hybridflow.algos import list_advantages
from hybridflow.config import PPOConfig, load_config
from hybridflow.trainer.main_ppo import run_ppo
from tests.trainer.ppo_fixtures import base_overrides
from tests.trainer.test_ppo_e2e import ESTIMATOR_OVERRIDES, read_metrics

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CONFIGS = {
    "grpo": [],
    "ppo_critic_kl_validation": ["algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=True",
                                 "algorithm.kl_ctrl.type=adaptive", "actor_rollout_ref.actor.use_kl_loss=True",
                                 "trainer.test_freq=2", "trainer.val_before_train=True"],
    # the reasoning preset's recipe: DAPO dynamic sampling, n = 8, skipped all-zero-advantage updates
    "dapo_dynamic_sampling": ["algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=score",
                              "algorithm.filter_groups.max_num_gen_batches=8", "data.train_batch_size=2",
                              "data.gen_batch_size=3", "actor_rollout_ref.rollout.n=8",
                              "actor_rollout_ref.actor.optim.skip_zero_grad_steps=True",
                              "actor_rollout_ref.actor.use_rollout_log_probs=True",
                              "actor_rollout_ref.model.use_shared_prompt=True"],
    "pf_ppo_rloo": ["algorithm.use_pf_ppo=True", "algorithm.adv_estimator=rloo"],
    "gdpo": ["algorithm.adv_estimator=gdpo", "algorithm.gdpo_reward_keys=[score,length]",
             "algorithm.gdpo_reward_weights=[1.0,0.5]"],
    "checkpoint_and_best": ["trainer.save_freq=1", "trainer.test_freq=1", "trainer.keep_best_checkpoint=True"],
}


DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, needs_cuda])]
# what shows the run's tensors lived where asked: the CUDA allocator's peak, or the process's resident set
MEMORY_METRIC = {"cpu": "perf/max_memory_rss_gb", "cuda": "perf/max_memory_allocated_gb"}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_training_steps_run_on_the_device(tmp_path, tiny_model_dir, name, device):
    overrides = base_overrides(tmp_path, tiny_model_dir) + [f"trainer.device={device}", *CONFIGS[name]]
    run_ppo(load_config(PPOConfig, overrides))
    rows = read_metrics(tmp_path)
    last = rows[-1]
    assert last["step"] == 2
    assert torch.isfinite(torch.tensor(last["actor/pg_loss"]))
    assert last[MEMORY_METRIC[device]] > 0


@pytest.mark.gpu
@needs_cuda
def test_resume_on_cuda_continues_from_the_checkpoint(tmp_path, tiny_model_dir):
    overrides = base_overrides(tmp_path, tiny_model_dir) + ["trainer.device=cuda", "trainer.save_freq=1"]
    run_ppo(load_config(PPOConfig, overrides))
    run_ppo(load_config(PPOConfig, [*overrides, "trainer.total_training_steps=3"]))
    rows = read_metrics(tmp_path)
    assert [row["step"] for row in rows] == [1, 2, 3]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("estimator", sorted(set(list_advantages()) - {"gae", "grpo"}))
def test_every_estimator_runs_a_step_on_cuda(tmp_path, tiny_model_dir, estimator):
    overrides = base_overrides(tmp_path, tiny_model_dir, estimator=estimator, steps=1) + ["trainer.device=cuda"]
    run_ppo(load_config(PPOConfig, overrides + ESTIMATOR_OVERRIDES.get(estimator, [])))
    last = read_metrics(tmp_path)[-1]
    assert torch.isfinite(torch.tensor(last["actor/pg_loss"]))


# ---------------------------------------------------------------------------- the other entry points on CUDA
def _fully_async(argv: list[str]) -> int:
    from hybridflow.trainer.main_fully_async import main

    return main([*argv, "async_training.staleness_threshold=1"])


def _one_step_off(argv: list[str]) -> int:
    from hybridflow.trainer.main_one_step_off import main

    return main(argv)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("entry", [_one_step_off, _fully_async], ids=["one_step_off", "fully_async"])
def test_async_trainers_run_on_cuda(tmp_path, tiny_model_dir, entry):
    assert entry(base_overrides(tmp_path, tiny_model_dir) + ["trainer.device=cuda"]) == 0


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("name", ["spin", "sppo"])
def test_self_play_runs_on_cuda(tmp_path, tiny_model_dir, name):
    from hybridflow.cli import main as cli_main
    from tests.trainer.test_self_play import self_play_overrides

    assert cli_main([name, *self_play_overrides(tmp_path, tiny_model_dir), "trainer.device=cuda",
                     "trainer.save_freq=2"]) == 0


@pytest.mark.gpu
@needs_cuda
def test_multi_turn_tool_grpo_runs_on_cuda(tmp_path, tiny_model_dir):
    from tests.trainer.test_agent_ppo import tool_task

    overrides = base_overrides(tmp_path, tiny_model_dir) + tool_task(tmp_path) + [
        "data.max_response_length=96", "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        "trainer.test_freq=2", "trainer.device=cuda"]
    run_ppo(load_config(PPOConfig, overrides))
    last = read_metrics(tmp_path)[-1]
    assert last["num_turns/min"] >= 2 and torch.isfinite(torch.tensor(last["actor/pg_loss"]))

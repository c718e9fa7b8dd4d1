"""verl 0.9.1's on-policy distillation example (examples/on_policy_distillation_trainer, its FSDP form) run on tiny
models: the example's keys as written, with only the module prefix, the model / data paths, the engine (vllm ->
native: no GPU) and the sizes (batch 128 of 2k-token GSM8K/MATH prompts -> 4 tiny prompts) changed."""

from __future__ import annotations

import json

import pytest

from hybridflow.models.tiny import save_tiny_model
from hybridflow.trainer.main_ppo import main
from tests.trainer.ppo_fixtures import write_reward, write_task


def example_command(tmp_path, student: str, teacher: str, *, loss_mode: str, use_policy_gradient: bool) -> list[str]:
    train, test = write_task(str(tmp_path / "data"))
    return [
        "--config-path=config", "--config-name=ppo_trainer",  # resolved as Hydra does: beside the entry module
        # DATA_CONFIG
        f"data.train_files=['{train}']", f"data.val_files=['{test}']", "data.train_batch_size=4",
        "data.max_prompt_length=64", "data.max_response_length=8", "data.filter_overlong_prompts=True",
        "data.truncation='error'",
        # ACTOR_CONFIG (the FSDP engine's keys)
        f"actor_rollout_ref.model.path={student}", "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.actor.optim.lr=1e-3", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=512",
        "actor_rollout_ref.actor.fsdp_config.param_offload=True",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
        # ROLLOUT_CONFIG
        "actor_rollout_ref.rollout.name=native", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3", "actor_rollout_ref.rollout.n=1",
        "actor_rollout_ref.rollout.max_model_len=73", "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=512",
        "actor_rollout_ref.rollout.free_cache_engine=True", "+actor_rollout_ref.rollout.enable_sleep_mode=True",
        # ALGORITHM_CONFIG
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=False",
        # DISTILL_CONFIG
        "distillation.enabled=True", "distillation.n_gpus_per_node=4", "distillation.nnodes=1",
        f"distillation.teacher_models.teacher_model.model_path={teacher}",
        "distillation.teacher_models.teacher_model.inference.name=vllm",
        "distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size=2",
        "distillation.teacher_models.teacher_model.inference.gpu_memory_utilization=0.3",
        "distillation.teacher_models.teacher_model.inference.max_model_len=73",
        "distillation.teacher_models.teacher_model.inference.free_cache_engine=True",
        "+distillation.teacher_models.teacher_model.inference.enable_sleep_mode=True",
        f"distillation.distillation_loss.loss_mode={loss_mode}", "distillation.distillation_loss.topk=8",
        "distillation.distillation_loss.use_task_rewards=False",
        f"distillation.distillation_loss.use_policy_gradient={use_policy_gradient}",
        "distillation.distillation_loss.loss_max_clamp=10.0", "distillation.distillation_loss.log_prob_min_clamp=-10.0",
        # TRAINER_CONFIG
        "trainer.balance_batch=True", "trainer.logger=['console','file']",
        "trainer.project_name='DISTILLATION-Qwen3-8B-BASE-GSM8K-MATH'", "trainer.experiment_name='tiny'",
        "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.val_before_train=False", "trainer.save_freq=200",
        "trainer.test_freq=5", "trainer.total_epochs=15", "trainer.total_training_steps=2",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}", f"custom_reward_function.path={write_reward(str(tmp_path))}",
    ]


@pytest.mark.parametrize("loss_mode,use_policy_gradient", [("forward_kl_topk", False), ("k1", True)])
def test_verl_s_distillation_example_runs(tmp_path, tiny_model_dir, loss_mode, use_policy_gradient):
    teacher = tmp_path / "teacher"
    save_tiny_model(str(teacher), arch="llama", seed=3)
    assert main(example_command(tmp_path, tiny_model_dir, str(teacher), loss_mode=loss_mode,
                                use_policy_gradient=use_policy_gradient)) == 0
    rows = [json.loads(line) for line in (tmp_path / "ckpt" / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    assert rows[-1]["actor/loss"] == pytest.approx(rows[-1]["actor/distillation/loss"], rel=1e-5)

"""On-policy distillation on the demo's task (benchmarks/distill_demo.py), its tiny path: a teacher SFT'd on the
task's right answers, a fresh student distilled from it with no task reward in the loss; the student's held-out
score rises from the untrained model's to near the teacher's."""

import json

import pytest

from tests.benchmarks.loader import loaded_benchmark


@pytest.fixture(scope="module")
def distill_demo():
    with loaded_benchmark("distill_demo") as module:
        yield module


def test_the_overrides_are_verl_s_distillation_keys_without_task_rewards(distill_demo):
    from hybridflow.config import PPOConfig, load_config

    cfg = load_config(PPOConfig, ["actor_rollout_ref.model.path=/s", *distill_demo.DISTILL,
                                  "distillation.teacher_models.teacher_model.model_path=/t"])
    loss = cfg.distillation.distillation_loss
    assert cfg.distillation.enabled and not loss.use_task_rewards and loss.loss_mode == "forward_kl_topk"


@pytest.mark.slow
def test_tiny_student_learns_the_task_from_the_teacher_alone(distill_demo, tmp_path):
    result = distill_demo.run("tiny", str(tmp_path), 30, ["trainer.test_freq=10"])
    assert result["teacher"] >= 0.9  # the teacher knows the task
    assert result["student_before"] <= 0.2 and result["student_after"] >= 0.8
    assert json.loads((tmp_path / "result.json").read_text())["student_after"] == result["student_after"]

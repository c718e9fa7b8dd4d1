"""On-policy distillation end to end (issue 60): verl 0.9.1's distillation.* keys on tiny student and teacher
models; each key changes the run (tests/algos/test_distillation.py has the math by hand)."""

from __future__ import annotations

import json

import pytest

from hybridflow.config import PPOConfig, load_config, validate_ppo_config
from hybridflow.errors import ConfigError, HybridflowError
from hybridflow.models.tiny import save_tiny_model
from hybridflow.trainer.main_ppo import run_ppo
from hybridflow.trainer.roles.teacher import distillation_of
from tests.trainer.ppo_fixtures import base_overrides


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("teacher")
    save_tiny_model(str(path), arch="llama", seed=7)
    return str(path)


def distill(tmp_path, student, teacher, *extra):
    overrides = base_overrides(tmp_path, student) + [
        "distillation.enabled=True", f"distillation.teacher_models.teacher_model.model_path={teacher}", *extra]
    run_ppo(load_config(PPOConfig, overrides))
    path = tmp_path / "ckpt" / "logs" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()][-1]


def test_with_task_rewards_the_loss_adds_coef_times_distillation(tmp_path, tiny_model_dir, teacher_dir):
    last = distill(tmp_path, tiny_model_dir, teacher_dir, "distillation.distillation_loss.distillation_loss_coef=0.5")
    assert "timing_s/teacher" in last and last["actor/distillation/loss"] > 0
    assert last["actor/loss"] == pytest.approx(last["actor/pg_loss"] + 0.5 * last["actor/distillation/loss"],
                                               rel=1e-4, abs=1e-6)


def test_without_task_rewards_the_loss_is_the_distillation_alone(tmp_path, tiny_model_dir, teacher_dir):
    last = distill(tmp_path, tiny_model_dir, teacher_dir, "distillation.distillation_loss.use_task_rewards=False",
                   "distillation.distillation_loss.distillation_loss_coef=0.5")
    assert last["actor/loss"] == pytest.approx(last["actor/distillation/loss"], rel=1e-5)
    assert last["actor/pg_loss"] != pytest.approx(0.0, abs=1e-9)  # computed, then dropped (as verl)


def test_policy_gradient_forward_kl_topk_on_packed_rows(tmp_path, tiny_model_dir, teacher_dir):
    last = distill(tmp_path, tiny_model_dir, teacher_dir, "distillation.distillation_loss.loss_mode=forward_kl_topk",
                   "distillation.distillation_loss.topk=4", "distillation.distillation_loss.use_policy_gradient=True",
                   "actor_rollout_ref.model.use_remove_padding=True")
    assert 0 < last["actor/distillation/teacher_mass"] <= 1 and 0 < last["actor/distillation/student_mass"] <= 1
    assert "actor/distillation/pg_clipfrac" in last  # the policy-gradient form ran


def test_teachers_routed_by_teacher_key(tmp_path, tiny_model_dir, teacher_dir):
    extra = ["+distillation.teacher_models.t1.key=digits", f"+distillation.teacher_models.t1.model_path={teacher_dir}"]
    assert "actor/distillation/loss" in distill(tmp_path / "a", tiny_model_dir, teacher_dir, *extra)
    with pytest.raises(HybridflowError, match="row 0 has 'math', which no teacher's key names"):
        distill(tmp_path / "b", tiny_model_dir, teacher_dir, *extra, "distillation.teacher_key=ability")


def test_disabled_runs_no_teacher(tmp_path, tiny_model_dir, teacher_dir):
    last = distill(tmp_path, tiny_model_dir, teacher_dir, "distillation.enabled=False")
    assert "timing_s/teacher" not in last and "actor/distillation/loss" not in last


def cfg(*overrides):
    return load_config(PPOConfig, ["actor_rollout_ref.model.path=/models/tiny", "distillation.enabled=True",
                                   "distillation.teacher_models.teacher_model.model_path=/models/teacher", *overrides])


@pytest.mark.parametrize("override,field,value", [
    ("loss_mode=forward_kl_topk", "loss_mode", "forward_kl_topk"), ("topk=7", "topk", 7),
    ("use_task_rewards=False", "use_task_rewards", False), ("distillation_loss_coef=0.3", "distillation_loss_coef", 0.3),
    ("loss_max_clamp=5.0", "loss_max_clamp", 5.0), ("log_prob_min_clamp=-3.0", "log_prob_min_clamp", -3.0),
    ("use_policy_gradient=True", "use_policy_gradient", True), ("clip_ratio=0.1", "clip_ratio", 0.1),
    ("clip_ratio_low=0.1", "clip_ratio_low", 0.1), ("clip_ratio_high=0.3", "clip_ratio_high", 0.3)])
def test_each_loss_key_reaches_the_actor_s_objective(override, field, value):
    assert getattr(distillation_of(cfg(f"distillation.distillation_loss.{override}")), field) == value


def test_verl_s_defaults():
    objective = distillation_of(cfg())
    assert (objective.loss_mode, objective.topk, objective.use_task_rewards, objective.use_policy_gradient,
            objective.loss_max_clamp, objective.log_prob_min_clamp) == ("k3", 32, True, False, None, None)
    assert distillation_of(load_config(PPOConfig, ["actor_rollout_ref.model.path=/m"])) is None


@pytest.mark.parametrize("overrides,fragment", [
    (("distillation.teacher_models.teacher_model.model_path=null",), "teacher_model.model_path is not set"),
    (("distillation.distillation_loss.loss_mode=k1",), "set use_policy_gradient=True or loss_mode=k3"),
    (("distillation.distillation_loss.loss_mode=jsd",), "loss_mode='jsd' is not one of"),
    (("distillation.distillation_loss.policy_loss_mode=gspo",), "only vanilla"),
    (("distillation.teacher_models.teacher_model.inference.max_model_len=10",), "max_model_len=10 is shorter"),
    (("+distillation.teacher_models.t1.model_path=/m",), "t1.key is not set"),
])
def test_bad_distillation_config_is_one_line_before_loading(overrides, fragment):
    with pytest.raises(ConfigError) as err:
        validate_ppo_config(cfg(*overrides), check_paths=False)
    (line,) = [line for line in str(err.value).splitlines() if "distillation" in line]
    assert fragment in line

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


# ------------------------------------------------------------------ verl 0.9.1 spellings and nulls
from hybridflow.config import PPOConfig, load_config  # noqa: E402
from hybridflow.errors import ConfigError  # noqa: E402


def ppo(*overrides):
    return load_config(PPOConfig, ["actor_rollout_ref.model.path=/models/tiny", *overrides])


@pytest.mark.parametrize("role", ["actor", "ref"])
def test_fsdp_config_spellings_set_the_role_s_switches(role):
    section = getattr(ppo(f"actor_rollout_ref.{role}.fsdp_config.use_torch_compile=True",
                          f"actor_rollout_ref.{role}.fsdp_config.entropy_checkpointing=True").actor_rollout_ref, role)
    assert section.use_torch_compile is True and section.entropy_checkpointing is True


def test_prefix_grouper_is_the_shared_prompt_forward():
    from hybridflow.workers.logprob import forward_layout

    def layout(*overrides):
        model = ppo(*overrides).actor_rollout_ref.model
        return forward_layout(use_remove_padding=model.use_remove_padding, use_shared_prompt=model.use_shared_prompt)

    assert layout("actor_rollout_ref.actor.use_prefix_grouper=True") == "shared_prompt"
    assert layout("actor_rollout_ref.actor.use_prefix_grouper=False") == "padded"
    assert layout("actor_rollout_ref.actor.use_prefix_grouper=False", "actor_rollout_ref.model.use_remove_padding=True") \
        == "packed"


def test_top_level_sandbox_fusion_and_standalone_rollout_pool():
    cfg = ppo("sandbox_fusion.memory_limit_mb=2048", "actor_rollout_ref.rollout.nnodes=1",
              "actor_rollout_ref.rollout.n_gpus_per_node=2")
    assert cfg.reward_model.sandbox_fusion.memory_limit_mb == 2048
    assert (cfg.rollout.nnodes, cfg.rollout.n_gpus_per_node, cfg.trainer.backend) == (1, 2, "ray")


def test_no_importance_sampling_with_both_nulls_and_a_threshold_needed_with_is():
    from hybridflow.trainer.main_ppo import check_algorithm_settings

    prefix = "algorithm.rollout_correction."
    check_algorithm_settings(ppo(f"{prefix}rollout_is=null", f"{prefix}rollout_is_threshold=null"))
    with pytest.raises(ConfigError, match="rollout_is_threshold"):
        check_algorithm_settings(ppo(f"{prefix}rollout_is=token", f"{prefix}rollout_is_threshold=null"))


def test_tensorboard_dir_from_the_plus_key_then_verl_s_variable(tmp_path, monkeypatch):
    from hybridflow.trainer.tracking.trackers import TensorboardBackend

    assert ppo(f"+trainer.tensorboard_dir={tmp_path / 'tb'}").trainer.tensorboard_dir == str(tmp_path / "tb")
    backend = TensorboardBackend(local_dir=str(tmp_path / "logs"), config={}, tensorboard_dir=str(tmp_path / "tb"))
    backend.log({"x": 1.0}, step=1)
    backend.finish()
    assert any(name.startswith("events.") for name in os.listdir(tmp_path / "tb"))
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "env"))
    assert TensorboardBackend(local_dir=str(tmp_path / "logs"), config={}).log_dir == str(tmp_path / "env")


# ------------------------------------------------------------------ optim.optimizer / optimizer_impl / override
def test_optimizer_class_module_and_overrides_build_that_optimizer():
    import torch

    from hybridflow.workers.optim import configured_optimizer

    model = torch.nn.Linear(3, 2)
    optim = ppo("actor_rollout_ref.actor.optim.optimizer=SGD", "actor_rollout_ref.actor.optim.lr=0.1",
                "+actor_rollout_ref.actor.optim.override_optimizer_config.momentum=0.5").actor_rollout_ref.actor.optim
    sgd = configured_optimizer(model.parameters(), optim)
    assert type(sgd) is torch.optim.SGD and sgd.defaults["momentum"] == 0.5 and sgd.defaults["lr"] == 0.1
    adamw = configured_optimizer(model.parameters(), ppo(
        "+actor_rollout_ref.actor.optim.override_optimizer_config.amsgrad=True").actor_rollout_ref.actor.optim)
    assert type(adamw) is torch.optim.AdamW and adamw.defaults["amsgrad"] is True
    plain = configured_optimizer(model.parameters(), ppo().actor_rollout_ref.actor.optim)
    assert type(plain) is torch.optim.AdamW and plain.defaults["amsgrad"] is False


@pytest.mark.parametrize("override,fragment", [
    ("critic.optim.optimizer_impl=no_such_module", "critic.optim.optimizer_impl='no_such_module' cannot be imported"),
    ("actor_rollout_ref.actor.optim.optimizer=Adamm", "actor_rollout_ref.actor.optim.optimizer='Adamm' is not a class")])
def test_a_bad_optimizer_is_one_line_before_loading(override, fragment):
    from hybridflow.config import validate_ppo_config

    with pytest.raises(ConfigError) as err:
        validate_ppo_config(ppo(override, "algorithm.adv_estimator=gae", "critic.model.path=/m"), check_paths=False)
    assert fragment in str(err.value)


def test_sft_lr_warmup_steps_wins_over_the_ratio():
    import torch

    from hybridflow.config import SFTConfig
    from hybridflow.trainer.sft_trainer import build_train_state

    def lr_after_one_step(*overrides):
        cfg = load_config(SFTConfig, ["model.path=/m", "optim.lr=1.0", "optim.warmup_steps_ratio=0.1", *overrides])
        state = build_train_state(cfg, torch.nn.Linear(2, 2), steps=100)
        state.scheduler.step()
        return state.scheduler.get_last_lr()[0]

    assert lr_after_one_step() == pytest.approx(1 / 10)  # 10 warm-up steps from the ratio
    assert lr_after_one_step("optim.lr_warmup_steps=4") == pytest.approx(1 / 4)
    assert lr_after_one_step("data.num_workers=2") == pytest.approx(1 / 10)  # accepted, no effect

"""verl 0.9's dialect (issue 37): each key takes effect, or is compatibility-only and warns once, or (Megatron)
is refused in one line that says what to use instead."""

import logging

import pytest

from hybridflow.config import PPOConfig, SFTConfig, load_config
from hybridflow.config.compat import COMPAT_ONLY
from hybridflow.config.sft import sft_messages_key, sft_packed
from hybridflow.trainer.entry import partial_rollouts
from hybridflow.errors import ConfigError
from hybridflow.trainer.roles.assembly import ray_group_kwargs

MODEL = "actor_rollout_ref.model.path=/models/tiny"


def ppo(*overrides, **kwargs):
    return load_config(PPOConfig, [MODEL, *overrides], **kwargs)


@pytest.mark.parametrize("role,owner", [("actor_rollout_ref.actor", "actor_rollout_ref.actor"),
                                        ("actor_rollout_ref.ref", "actor_rollout_ref.ref"),
                                        ("critic.model", "critic")])
def test_fsdp_config_strategy_and_ulysses_size_are_the_role_s_own(role, owner):
    cfg = ppo(f"{role}.fsdp_config.ulysses_sequence_parallel_size=2", f"{role}.fsdp_config.strategy=fsdp2")
    section = cfg
    for part in owner.split("."):
        section = getattr(section, part)
    assert section.ulysses_sequence_parallel_size == 2
    assert section.strategy == "fsdp2"


def test_reward_model_model_path_in_verl_0_9_spelling():
    assert ppo("reward.reward_model.model_path=/models/rm").reward_model.model.path == "/models/rm"


def test_runtime_env_reaches_ray_init():
    cfg = ppo("trainer.backend=ray", "trainer.device=cpu", "+ray_kwargs.ray_init.runtime_env.py_executable=uv run",
              "+ray_kwargs.ray_init.runtime_env.env_vars.NCCL_DEBUG=WARN")
    assert ray_group_kwargs(cfg)["ray_runtime_env"] == {"py_executable": "uv run", "env_vars": {"NCCL_DEBUG": "WARN"}}


@pytest.mark.parametrize("override", ["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                                      "critic.megatron.pipeline_model_parallel_size=2"])
def test_megatron_keys_are_refused_saying_so(override):
    with pytest.raises(ConfigError) as err:
        ppo(override)
    (line,) = str(err.value).splitlines()
    assert "Megatron-LM is not supported" in line and "strategy=fsdp2" in line


def test_strategy_megatron_is_refused_saying_so(tmp_path):
    from hybridflow.config import validate_ppo_config

    with pytest.raises(ConfigError) as err:
        validate_ppo_config(ppo("actor_rollout_ref.actor.strategy=megatron"), check_paths=False)
    lines = [line for line in str(err.value).splitlines() if "megatron" in line]
    # ref.strategy follows actor.strategy: one line naming the key that was set (issue 59), and the fix
    keys = [line.split("=")[0] for line in lines]
    assert keys == ["actor_rollout_ref.actor.strategy"]
    assert all("Megatron-LM is not supported" in line for line in lines)


@pytest.mark.parametrize("override,key", [
    ("+actor_rollout_ref.rollout.checkpoint_engine.backend=nccl", "actor_rollout_ref.rollout.checkpoint_engine"),
    ("+actor_rollout_ref.rollout.trace.backend=mlflow", "actor_rollout_ref.rollout.trace"),
    ("+global_profiler.tool=nsys", "global_profiler"),
    ("actor_rollout_ref.rollout.multi_stage_wake_up=True", "actor_rollout_ref.rollout.multi_stage_wake_up"),
    ("reward_model.enable_resource_pool=True", "reward_model.enable_resource_pool"),
    ("reward_model.n_gpus_per_node=4", "reward_model.n_gpus_per_node"),
    ("reward_model.nnodes=1", "reward_model.nnodes"),
])
def test_warn_only_keys_warn_once(override, key, caplog, monkeypatch):
    from hybridflow.config import compat

    assert key in COMPAT_ONLY
    monkeypatch.setattr(compat, "_warned", set())  # once per process: other tests may have set the key before
    with caplog.at_level(logging.WARNING):
        ppo(override)
        ppo(override)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith(key + "=")]
    assert "accepted for verl compatibility and has no effect" in line


def test_split_placement_picks_the_ray_backend_from_verl_s_keys():
    assert ppo("rollout.nnodes=1", "rollout.n_gpus_per_node=2").trainer.backend == "ray"
    assert ppo().trainer.backend == "local"
    assert ppo("trainer.backend=ray").trainer.backend == "ray"


def test_partial_rollout_with_a_server_engine_warns_and_is_off(caplog, monkeypatch):
    """SGLang, and vLLM in multi-turn, cannot pause: verl's fully async YAML turns partial_rollout on with them, so it
    is off with a warning; vLLM and the native engine single-turn pause (issue 56: tests/rollout/test_vllm_partial)."""
    from hybridflow.trainer import entry as validate

    monkeypatch.setattr(validate, "_PARTIAL_WARNED", set())  # said once per process
    with caplog.at_level(logging.WARNING):
        assert partial_rollouts(ppo("async_training.partial_rollout=True", "actor_rollout_ref.rollout.name=sglang")) \
            is False
        assert partial_rollouts(ppo("async_training.partial_rollout=True", "actor_rollout_ref.rollout.name=vllm",
                                    "actor_rollout_ref.rollout.multi_turn.enable=True")) is False
    assert "partial_rollout=True has no effect here (the sglang engine cannot pause)" in caplog.text
    assert "partial_rollout=True has no effect here (the vllm engine in multi-turn cannot pause)" in caplog.text
    assert partial_rollouts(ppo("async_training.partial_rollout=True")) is True
    assert partial_rollouts(ppo("async_training.partial_rollout=True", "actor_rollout_ref.rollout.name=vllm")) is True


def test_gdpo_reward_manager_name_builds():
    from hybridflow.rewards.manager import build_reward_manager, list_reward_managers

    assert "gdpo" in list_reward_managers()
    manager = build_reward_manager("gdpo", compute_score=lambda *a, **k: 1.0)
    assert type(manager).__name__ == "RewardManager"


def test_main_dapo_starts_from_the_recipe_s_defaults():
    from hybridflow.trainer.main_dapo import DAPO_DEFAULTS

    cfg = ppo("data.train_batch_size=16", defaults=DAPO_DEFAULTS)
    got = (cfg.reward_model.reward_manager, cfg.data.gen_batch_size, cfg.trainer.project_name)
    assert got == ("dapo", 16, "verl-dapo")
    assert ppo("reward_model.reward_manager=naive", defaults=DAPO_DEFAULTS).reward_model.reward_manager == "naive"


# ------------------------------------------------------------------ verl 0.9's SFT trainer
def sft(*overrides):
    return load_config(SFTConfig, ["model.path=/models/tiny", *overrides])


def test_sft_engine_group_and_keys():
    cfg = sft("engine=fsdp", "optim=fsdp", "model=hf_model", "engine.ulysses_sequence_parallel_size=2",
              "engine.strategy=fsdp2", "engine.fsdp_size=4", "engine.param_offload=True",
              "model.use_remove_padding=True", "optim.lr_warmup_steps_ratio=0.01", "optim.warmup_style=constant",
              "checkpoint.save_contents=[model]")
    assert cfg.ulysses_sequence_parallel_size == 2 and cfg.model.strategy == "fsdp2"
    assert cfg.model.fsdp_config.fsdp_size == 4 and cfg.model.fsdp_config.param_offload
    assert cfg.use_remove_padding and cfg.optim.warmup_steps_ratio == 0.01 and cfg.optim.lr_scheduler == "constant"
    assert cfg.trainer.checkpoint.save_contents == ["model"]


@pytest.mark.parametrize("override", ["engine=megatron", "optim=megatron"])
def test_sft_megatron_engine_is_refused_saying_so(override):
    with pytest.raises(ConfigError, match="Megatron-LM is not supported"):
        sft(override)


def test_sft_messages_key_and_pad_mode_take_effect():
    cfg = sft("data.messages_key=conversation", "data.pad_mode=no_padding")
    assert sft_messages_key(cfg.data) == "conversation" and sft_packed(cfg)
    plain = sft()
    assert sft_messages_key(plain.data) is None and not sft_packed(plain)
    assert not sft_packed(sft("data.pad_mode=right"))


# ------------------------------------------------------------------ verl's fully async rollouter budget
def test_rollout_total_epochs_and_test_freq_take_effect():
    from hybridflow.trainer.loop.async_source import async_training_steps
    from hybridflow.trainer.main_fully_async import async_validation_every

    cfg = ppo("trainer.total_epochs=30", "rollout.total_epochs=2", "async_training.require_batches=2")
    assert async_training_steps(cfg, steps_per_epoch=4) == 4 * 2 // 2  # 2 passes of 4 batches, 2 batches a step
    cfg = ppo("rollout.test_freq=2", "async_training.trigger_parameter_sync_step=3", "trainer.test_freq=5")
    assert async_validation_every(cfg) == 6  # every 2 weight syncs of 3 steps each
    assert ppo("rollout.n=16").actor_rollout_ref.rollout.n == 16  # the fully async YAML's copy of n

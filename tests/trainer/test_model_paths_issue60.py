"""verl 0.9.1's model paths (issue 60): lora_adapter_path continues a trained adapter, tokenizer_path and
hf_config_path read the tokenizer and the HF config from their own folders."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from hybridflow.config import PPOConfig, load_config
from hybridflow.data.parallel import LOCAL
from hybridflow.models import load_causal_lm
from hybridflow.models.lora import apply_lora, merge_lora, save_adapter
from hybridflow.trainer.roles.builders import build_hybrid_engine, load_policy, policy_tokenizer
from hybridflow.workers.logprob import batch_log_probs
from tests.controller.test_ray_group import rollout_batch


@pytest.fixture(scope="module")
def adapter_dir(tiny_model_dir, tmp_path_factory):
    """A LoRA adapter on the tiny model whose B is not zero (a trained one changes the model's outputs)."""
    torch.manual_seed(0)
    model = apply_lora(load_causal_lm(tiny_model_dir), rank=4, alpha=8, target_modules=["q_proj", "v_proj"])
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    path = tmp_path_factory.mktemp("adapter")
    save_adapter(model, str(path))
    return str(path), merge_lora(model)


def test_lora_adapter_path_trains_the_adapter_and_the_reference_is_the_base(tiny_model_dir, adapter_dir):
    path, merged = adapter_dir
    cfg = load_config(PPOConfig, [f"actor_rollout_ref.model.path={tiny_model_dir}",
                                  f"actor_rollout_ref.model.lora_adapter_path={path}",
                                  "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.rollout.n=2",
                                  "data.max_response_length=6"])
    engine = build_hybrid_engine(LOCAL, cfg=cfg, total_steps=1)
    batch = rollout_batch()
    mask = batch["response_mask"].bool()
    actor, _ = engine.actor.compute_log_prob(batch, temperature=1.0)
    expected, _ = batch_log_probs(merged, batch, temperature=1.0, micro_batch_size=None)
    assert torch.allclose(actor[mask], expected[mask], atol=1e-4)  # the adapter is on
    reference = engine.reference.compute_ref_log_prob(batch, temperature=1.0)
    base, _ = batch_log_probs(load_causal_lm(tiny_model_dir), batch, temperature=1.0, micro_batch_size=None)
    assert torch.allclose(reference[mask], base[mask], atol=1e-4)  # the reference is the base model
    assert not torch.allclose(actor[mask], reference[mask], atol=1e-2)
    trainable = [name for name, p in engine.actor.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)


def test_rollouts_start_from_the_merged_weights(tiny_model_dir, adapter_dir):
    from hybridflow.models.lora import load_lora_adapter, merged_copy

    path, merged = adapter_dir
    adapted = load_lora_adapter(load_causal_lm(tiny_model_dir), path)
    copy = merged_copy(adapted)
    assert type(copy) is type(merged)
    for (name, value), (_, expected) in zip(copy.state_dict().items(), merged.state_dict().items()):
        assert torch.allclose(value, expected, atol=1e-6), name
    assert any("lora_" in name for name, _ in adapted.named_parameters())  # the actor's model keeps its adapter


def test_a_folder_without_an_adapter_is_one_line(tiny_model_dir, tmp_path):
    from hybridflow.errors import ConfigError

    cfg = load_config(PPOConfig, [f"actor_rollout_ref.model.path={tiny_model_dir}",
                                  f"actor_rollout_ref.model.lora_adapter_path={tmp_path}"])
    with pytest.raises(ConfigError, match="holds no adapter_config.json"):
        build_hybrid_engine(LOCAL, cfg=cfg, total_steps=1, with_rollout=False)


def test_tokenizer_path_and_hf_config_path(tiny_model_dir, tmp_path):
    tokenizer_dir, config_dir = tmp_path / "tok", tmp_path / "cfg"
    shutil.copytree(tiny_model_dir, tokenizer_dir)
    (tokenizer_dir / "chat_template.jinja").write_text("MINE {{ messages }}")
    (tokenizer_dir / "tokenizer_config.json").write_text(json.dumps({
        **json.loads((tokenizer_dir / "tokenizer_config.json").read_text()), "chat_template": "MINE {{ messages }}"}))
    config_dir.mkdir()
    config = json.loads((tokenizer_dir / "config.json").read_text())
    (config_dir / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 0.123}))
    cfg = load_config(PPOConfig, [f"actor_rollout_ref.model.path={tiny_model_dir}",
                                  f"actor_rollout_ref.model.tokenizer_path={tokenizer_dir}",
                                  f"actor_rollout_ref.model.hf_config_path={config_dir}"])
    assert policy_tokenizer(cfg).chat_template == "MINE {{ messages }}"
    assert load_policy(cfg, torch.device("cpu")).config.rms_norm_eps == pytest.approx(0.123)
    plain = load_config(PPOConfig, [f"actor_rollout_ref.model.path={tiny_model_dir}"])
    assert policy_tokenizer(plain).chat_template != "MINE {{ messages }}"
    assert load_policy(plain, torch.device("cpu")).config.rms_norm_eps != pytest.approx(0.123)

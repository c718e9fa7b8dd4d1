"""The fastest exact layout is the default: shared-prompt forwards unless the keys choose otherwise, and the
padded layout, said once, for a model whose attention would not keep a packed row's sequences apart."""

import logging

import pytest

from hybridflow.config import PPOConfig, load_config
from hybridflow.models import build_tiny_model
from hybridflow.trainer.roles.builders import model_layout

KEY = "actor_rollout_ref.model"


def layout_of(overrides: list[str], model) -> str:
    cfg = load_config(PPOConfig, [f"{KEY}.path=unused", *overrides])
    return model_layout(cfg.actor_rollout_ref.model, model, key=KEY)


@pytest.fixture(scope="module")
def model(tiny_tokenizer):
    return build_tiny_model("qwen2", seed=0, tokenizer=tiny_tokenizer)[0]


def test_a_verl_user_who_types_nothing_gets_shared_prompts(model):
    assert layout_of([], model) == "shared_prompt"
    assert layout_of([f"{KEY}.use_shared_prompt=False"], model) == "padded"
    assert layout_of([f"{KEY}.use_shared_prompt=False", f"{KEY}.use_remove_padding=True"], model) == "packed"


def test_a_model_with_its_own_attention_code_falls_back_to_padded_with_one_warning(model, monkeypatch, caplog):
    for cls in type(model).__mro__:  # as a model whose attention does not go through AttentionInterface
        if "_supports_attention_backend" in vars(cls):
            monkeypatch.setattr(cls, "_supports_attention_backend", False)
    with caplog.at_level(logging.WARNING):
        assert layout_of([], model) == "padded"
    assert len(caplog.records) == 1 and "the padded layout runs" in caplog.records[0].getMessage()
    assert f"{KEY}.use_shared_prompt=False" in caplog.records[0].getMessage()


def test_param_offload_on_one_process_says_it_has_no_effect(caplog):
    """verl wraps FSDP even on one GPU, so its ``param_offload`` offloads there; hybridflow trains the plain model on
    one process, so the key would do nothing in silence: it says so once (honest surface), and the model still runs."""
    from types import SimpleNamespace

    import torch

    from hybridflow.data.parallel import DataParallel
    from hybridflow.models.tiny import build_tiny_model
    from hybridflow.trainer.roles import builders

    model, _ = build_tiny_model("llama", seed=0)
    wrap = SimpleNamespace(transformer_layer_cls_to_wrap=None)
    offload = SimpleNamespace(param_offload=True, offload_policy=False, wrap_policy=wrap)
    plain = SimpleNamespace(param_offload=False, offload_policy=False, wrap_policy=wrap)
    builders.warn_param_offload_unsharded.cache_clear()
    with caplog.at_level("WARNING"):
        builders.shard_for_group(model, dp=DataParallel(), fsdp_cfg=plain, device=torch.device("cpu"))
        assert "param_offload" not in caplog.text
        for _ in range(2):
            builders.shard_for_group(model, dp=DataParallel(), fsdp_cfg=offload, device=torch.device("cpu"))
    assert caplog.text.count("fsdp_config.param_offload=True has no effect with one training process") == 1

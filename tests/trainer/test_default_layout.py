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

"""The declared architecture table and the reasons a model falls outside it."""

import pytest

from hybridflow.errors import RolloutError
from transformers import BertConfig

from hybridflow.models.tiny import TINY_ARCHITECTURES, TINY_WINDOW, build_tiny_model, tiny_config
from hybridflow.rollout import build_engine
from hybridflow.rollout.architectures import ARCHITECTURES, layer_windows, unsupported_reason
from hybridflow.rollout.hf import HFEngine
from hybridflow.rollout.native import NativeEngine


@pytest.mark.parametrize("arch", TINY_ARCHITECTURES)
def test_every_tiny_architecture_is_in_the_table_and_runs_natively(arch):
    assert arch in ARCHITECTURES and unsupported_reason(tiny_config(arch)) is None


def test_each_layer_gets_its_window():
    assert layer_windows(tiny_config("mistral", sliding_window=256)) == [256, 256]
    assert layer_windows(tiny_config("gemma2")) == [TINY_WINDOW, None, TINY_WINDOW]  # local, global, local
    assert layer_windows(tiny_config("llama")) == [None, None]
    # Qwen2 applies its window only with use_sliding_window.
    assert layer_windows(tiny_config("qwen2", sliding_window=8, use_sliding_window=False)) == [None, None]


def test_other_activations_partial_rotary_and_bidirectional_attention_are_refused():
    assert "partial rotary" in unsupported_reason(tiny_config("phi3", partial_rotary_factor=0.5))
    assert "hidden_act='gelu'" in unsupported_reason(tiny_config("llama", hidden_act="gelu"))
    assert "hidden_act='gelu'" in unsupported_reason(tiny_config("gemma2", hidden_activation="gelu"))
    assert "bidirectional" in unsupported_reason(tiny_config("gemma3_text", use_bidirectional_attention=True))
    assert "'bert' is not in" in unsupported_reason(BertConfig())


def test_the_engine_refuses_what_it_cannot_run_and_build_engine_falls_back(tiny_tokenizer):
    model, tokenizer = build_tiny_model("phi3", tokenizer=tiny_tokenizer, partial_rotary_factor=0.5)
    with pytest.raises(RolloutError, match="partial rotary .* set rollout.name=hf"):
        NativeEngine(model, tokenizer, max_model_len=64)
    with pytest.warns(UserWarning, match="through HF generate.*partial rotary"):
        assert isinstance(build_engine("native", model, tokenizer, max_model_len=64), HFEngine)
    windowed, _ = build_tiny_model("mistral", tokenizer=tiny_tokenizer, sliding_window=16)
    assert isinstance(build_engine("native", windowed, tokenizer, max_model_len=64), NativeEngine)

"""The declared architecture table and the reasons a model falls outside it."""

import pytest

from hybridflow.errors import RolloutError
from hybridflow.models.tiny import build_tiny_model, tiny_config
from hybridflow.rollout import build_engine
from hybridflow.rollout.architectures import ARCHITECTURES, unsupported_reason
from hybridflow.rollout.hf import HFEngine
from hybridflow.rollout.native import NativeEngine


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral", "phi3"])
def test_every_tiny_architecture_is_in_the_table_and_runs_natively(arch):
    assert arch in ARCHITECTURES and unsupported_reason(tiny_config(arch)) is None


def test_a_sliding_window_counts_only_where_the_context_outgrows_it():
    mistral = tiny_config("mistral", sliding_window=256)  # max_position_embeddings 1024
    assert "a sliding window of 256 positions shorter than the context (1024)" in unsupported_reason(mistral)
    assert unsupported_reason(mistral, max_model_len=256) is None  # the window never bites
    assert "shorter than the context (257)" in unsupported_reason(mistral, max_model_len=257)
    # Qwen2 applies its window only with use_sliding_window.
    assert unsupported_reason(tiny_config("qwen2", sliding_window=8, use_sliding_window=False)) is None
    assert "sliding window of 8" in unsupported_reason(tiny_config("qwen2", sliding_window=8, use_sliding_window=True))


def test_partial_rotary_and_other_activations_are_refused():
    assert "partial rotary" in unsupported_reason(tiny_config("phi3", partial_rotary_factor=0.5))
    assert "hidden_act='gelu'" in unsupported_reason(tiny_config("llama", hidden_act="gelu"))


def test_the_engine_refuses_what_it_cannot_run_and_build_engine_falls_back(tiny_tokenizer):
    model, tokenizer = build_tiny_model("mistral", tokenizer=tiny_tokenizer, sliding_window=16)
    with pytest.raises(RolloutError, match="sliding window of 16 .* set rollout.name=hf"):
        NativeEngine(model, tokenizer, max_model_len=64)
    assert isinstance(NativeEngine(model, tokenizer, max_model_len=16), NativeEngine)
    with pytest.warns(UserWarning, match="sliding window of 16"):
        assert isinstance(build_engine("native", model, tokenizer, max_model_len=64), HFEngine)
    assert isinstance(build_engine("native", model, tokenizer, max_model_len=16), NativeEngine)

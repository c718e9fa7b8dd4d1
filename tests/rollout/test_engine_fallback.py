"""The native engine's fallback to HF generate says which architecture fell back and why, in one warning."""

import pytest
from transformers import AutoModelForCausalLM, GPT2Config

from hybridflow.models.tiny import build_tiny_model
from hybridflow.rollout.engine import build_engine
from hybridflow.rollout.hf import HFEngine


def test_an_architecture_outside_the_table_names_it_and_the_table():
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, architectures=["GPT2LMHeadModel"])
    model = AutoModelForCausalLM.from_config(config)
    with pytest.warns(UserWarning, match=r"runs \['GPT2LMHeadModel'\] through HF generate .*: model_type 'gpt2' "
                                         r"is not in hybridflow.rollout.architectures.ARCHITECTURES \[.*'llama'"):
        assert isinstance(build_engine("native", model), HFEngine)


def test_a_supported_type_with_an_unsupported_config_says_so():
    model, tokenizer = build_tiny_model(hidden_act="gelu")
    with pytest.warns(UserWarning, match=r"HF generate .*: hidden_act='gelu' \(the decoder runs gated MLPs with "
                                         r"silu or gelu_pytorch_tanh\)"):
        assert isinstance(build_engine("native", model, tokenizer), HFEngine)

"""The helpers every entry point shares: one device rule, one seed rule, one context-length rule."""

import random

import numpy as np
import pytest
import torch
from transformers import LlamaConfig

from hybridflow.errors import ConfigError
from hybridflow.trainer.entry import model_context_length, resolve_device, seed_everything


def test_seed_everything_replays_python_numpy_and_torch():
    seed_everything(7)
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    seed_everything(7)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first


def test_cpu_and_auto_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("cpu") == torch.device("cpu") and resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match="use trainer.device=cpu or auto"):
        resolve_device("cuda")


def test_context_length_from_config_json_and_override_wins(tmp_path):
    LlamaConfig(max_position_embeddings=96, hidden_size=8, intermediate_size=16, num_attention_heads=2,
                num_hidden_layers=1, vocab_size=32).save_pretrained(tmp_path)
    assert model_context_length(str(tmp_path), False) == 96
    assert model_context_length(str(tmp_path), False, {"max_position_embeddings": 4096}) == 4096
    assert model_context_length(str(tmp_path / "missing"), False) is None

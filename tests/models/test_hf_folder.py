"""HF folders written from models and merged from checkpoints, with and without LoRA; RNG state files."""

import copy
import os
import random

import numpy as np
import torch

from hybridflow.models.hf_folder import HF_FOLDER, LORA_FOLDER, save_hf_folder
from hybridflow.models.lora import apply_lora, merge_lora, save_adapter
from hybridflow.models.rng_state import capture_rng_state, restore_rng_state
from hybridflow.models.tiny import build_tiny_model
from hybridflow.model_merger import merge as merge_checkpoint
from hybridflow.models.sharded_checkpoint import DCP_FOLDER, save_sharded

IDS = torch.tensor([[5, 17, 42, 99, 3]])


def trained_lora_model():
    """A tiny LoRA model whose B matrices are non-zero, so the adapter changes the logits."""
    model, tokenizer = build_tiny_model("llama", seed=0)
    model = apply_lora(model, rank=4, alpha=8)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    return model.eval(), tokenizer


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def test_metadata_only_folder_of_a_lora_model_has_its_adapter_config(tmp_path):
    model, tokenizer = trained_lora_model()
    save_hf_folder(model, tokenizer, str(tmp_path), include_weights=False)
    files = set(os.listdir(tmp_path))
    assert {"config.json", "generation_config.json", "adapter_config.json", "tokenizer.json"} <= files
    assert not any(name.endswith(".safetensors") for name in files)


def test_merged_export_over_metadata_drops_the_adapter_config_and_loads(tmp_path):
    from transformers import AutoModelForCausalLM

    model, tokenizer = trained_lora_model()
    expected = logits(model)
    save_hf_folder(model, tokenizer, str(tmp_path), include_weights=False)
    save_hf_folder(merge_lora(copy.deepcopy(model)), tokenizer, str(tmp_path))
    assert not (tmp_path / "adapter_config.json").exists()
    exported = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    torch.testing.assert_close(logits(exported), expected, rtol=1e-5, atol=1e-5)


def test_merger_finds_the_lora_structure_in_the_adapter_folder(tmp_path):
    """SFT layout after a merged export: huggingface/ is plain, lora_adapter/ keeps the LoRA config."""
    from transformers import AutoModelForCausalLM

    model, tokenizer = trained_lora_model()
    expected = logits(model)
    local_dir = tmp_path / "actor"
    local_dir.mkdir()
    save_sharded(str(local_dir / DCP_FOLDER), model=model)  # LoRA names, as the SFT checkpoint writes them
    save_hf_folder(merge_lora(copy.deepcopy(model)), tokenizer, str(local_dir / HF_FOLDER), include_weights=False)
    save_adapter(model, str(local_dir / LORA_FOLDER))
    assert not (local_dir / HF_FOLDER / "adapter_config.json").exists()
    target = merge_checkpoint(str(local_dir), str(tmp_path / "merged"))
    merged = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    torch.testing.assert_close(logits(merged), expected, rtol=1e-5, atol=1e-5)


def test_rng_state_round_trips_through_a_weights_only_file(tmp_path):
    path = tmp_path / "rng_state_rank0.pt"
    torch.save(capture_rng_state(), path)
    expected = (random.random(), np.random.rand(), torch.rand(3))
    random.random(), np.random.rand(), torch.rand(3)  # move every generator on
    restore_rng_state(torch.load(path, weights_only=True))
    python_draw, numpy_draw, torch_draw = random.random(), np.random.rand(), torch.rand(3)
    assert python_draw == expected[0] and numpy_draw == expected[1]
    assert torch.equal(torch_draw, expected[2])

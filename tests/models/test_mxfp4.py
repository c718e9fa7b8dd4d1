"""gpt-oss checkpoints as shipped: MXFP4 experts (issue 58). A tiny random gpt-oss whose experts this file quantizes
with its own MXFP4 encoder (OCP Microscaling spec: blocks of 32 values along the input dimension, one e8m0 scale
2^(s - 127) a block, fp4 e2m1 elements, two to a byte, the even element in the low nibble) loads dequantized into
the training dtype, each expert weight exactly the decoded value, and the native engine decodes it as HF does."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from hybridflow.models import load_causal_lm
from hybridflow.models.tiny import build_tiny_model

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
"""The non-negative fp4 e2m1 values by code 0-7; codes 8-15 are their negatives."""


def encode_block(values: list[float]) -> tuple[int, list[int]]:
    """32 floats -> (e8m0 scale byte, 16 bytes): the scale is the power of two that brings the largest magnitude to
    at most 6 (e2m1's largest), each value the nearest e2m1 code of value / scale (ties to the lower code)."""
    largest = max(abs(v) for v in values)
    exponent = math.ceil(math.log2(largest / 6.0)) if largest > 0 else -127
    scale = 2.0 ** exponent
    codes = []
    for value in values:
        magnitude = min(range(8), key=lambda code: (abs(abs(value) / scale - E2M1[code]), code))
        codes.append(magnitude | (8 if value < 0 and magnitude else 0))
    return exponent + 127, [codes[i] | codes[i + 1] << 4 for i in range(0, 32, 2)]


def decode_block(scale: int, packed: list[int]) -> list[float]:
    codes = [nibble for byte in packed for nibble in (byte & 15, byte >> 4)]
    return [(-1 if code & 8 else 1) * E2M1[code & 7] * 2.0 ** (scale - 127) for code in codes]


def test_the_encoder_by_hand():
    """Largest magnitude 3 -> exponent ceil(log2(0.5)) = -1 (scale byte 126): 3 / 0.5 = 6 (code 7), -0.25 / 0.5 =
    -0.5 (code 9), 0.3 / 0.5 = 0.6 -> 0.5 (code 1), 0.9 / 0.5 = 1.8 -> 2.0 (code 4)."""
    values = [3.0, -0.25, 0.3, 0.9] + [0.0] * 28
    scale, packed = encode_block(values)
    assert scale == 126
    assert packed[:2] == [7 | 9 << 4, 1 | 4 << 4] and packed[2:] == [0] * 14
    assert decode_block(scale, packed)[:4] == [3.0, -0.25, 0.25, 1.0]


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A module's expert tensor ``[E, in, out]`` -> (blocks ``[E, out, in / 32, 16]`` uint8, scales
    ``[E, out, in / 32]`` uint8, the decoded ``[E, in, out]``): the checkpoint's layout (per output, along inputs)."""
    rows = weight.transpose(1, 2).double()  # [E, out, in]
    experts, outs, inputs = rows.shape
    blocks = torch.zeros(experts, outs, inputs // 32, 16, dtype=torch.uint8)
    scales = torch.zeros(experts, outs, inputs // 32, dtype=torch.uint8)
    decoded = torch.zeros(experts, outs, inputs, dtype=torch.float64)
    for e in range(experts):
        for o in range(outs):
            for g in range(inputs // 32):
                scale, packed = encode_block(rows[e, o, 32 * g:32 * g + 32].tolist())
                blocks[e, o, g], scales[e, o, g] = torch.tensor(packed, dtype=torch.uint8), scale
                decoded[e, o, 32 * g:32 * g + 32] = torch.tensor(decode_block(scale, packed))
    return blocks, scales, decoded.transpose(1, 2)


@pytest.fixture(scope="module")
def mxfp4_checkpoint(tmp_path_factory, tiny_tokenizer):
    """The tiny gpt-oss saved as its shipped checkpoints are: experts as ``*_blocks`` / ``*_scales``, the config's
    ``quantization_config``; and the decoded expert weights each key should load as."""
    model, tokenizer = build_tiny_model("gpt_oss", seed=3, tokenizer=tiny_tokenizer)
    folder = tmp_path_factory.mktemp("gpt_oss_mxfp4")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    tensors = load_file(folder / "model.safetensors")
    expected = {}
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        blocks, scales, expected[name] = quantize(tensors.pop(name))
        tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = blocks, scales
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (folder / "config.json").write_text(json.dumps(config))
    return folder, expected, tokenizer


def test_mxfp4_experts_load_dequantized_in_the_training_dtype(mxfp4_checkpoint):
    folder, expected, _ = mxfp4_checkpoint
    assert len(expected) == 4  # two layers, two projections
    model = load_causal_lm(str(folder), dtype="float32")
    state = model.state_dict()
    for name, decoded in expected.items():
        assert state[name].dtype == torch.float32
        assert torch.equal(state[name].double(), decoded), name  # e2m1 times a power of two: exact in fp32
    assert not hasattr(model.config, "quantization_config")  # a plain model now: it saves and trains as one
    assert any(p.requires_grad for n, p in model.named_parameters() if "experts" in n)


def test_where_transformers_would_keep_mxfp4_the_experts_load_dequantized(mxfp4_checkpoint, monkeypatch):
    """On a GPU with transformers' MXFP4 kernels (Triton, ``kernels``) it keeps the experts quantized (no gradient,
    no ``gate_up_proj`` for the native engine) unless asked to dequantize: that machine, as its quantizer sees it."""
    from transformers.quantizers import quantizer_mxfp4

    monkeypatch.setattr(quantizer_mxfp4, "get_current_accelerator", lambda: torch.device("cuda"))
    monkeypatch.setattr(quantizer_mxfp4, "is_triton_available", lambda *args: True)
    monkeypatch.setattr(quantizer_mxfp4, "is_kernels_available", lambda *args: True)
    monkeypatch.setattr(quantizer_mxfp4.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(quantizer_mxfp4.torch.cuda, "get_device_capability", lambda *args: (9, 0))
    monkeypatch.setattr(quantizer_mxfp4.torch.cuda, "empty_cache", lambda: None)
    folder, expected, _ = mxfp4_checkpoint
    state = load_causal_lm(str(folder), dtype="float32").state_dict()
    for name, decoded in expected.items():
        assert torch.equal(state[name].double(), decoded), name


def test_the_dequantized_model_decodes_natively_as_hf_does(mxfp4_checkpoint):
    from hybridflow.rollout import SamplingParams
    from hybridflow.rollout.native import NativeEngine
    from tests.rollout.conftest import chat_prompts
    from tests.rollout.test_native import hf_greedy

    folder, _, tokenizer = mxfp4_checkpoint
    model = load_causal_lm(str(folder), dtype="float32")
    prompts = chat_prompts(tokenizer)[:2]
    eos = tokenizer.eos_token_id
    got = NativeEngine(model, tokenizer).generate(prompts, SamplingParams(temperature=0, max_tokens=8,
                                                                          stop_token_ids=[eos]))
    assert [c.token_ids for c in got] == [hf_greedy(model, p, max_new_tokens=8, eos=eos) for p in prompts]

"""HF's rotary embedding under autocast as one autograd function (hybridflow.models.fused_rotary)."""

import copy
import sys

import pytest
import torch
from transformers.models.llama import modeling_llama

from hybridflow.models.fused_rotary import RotateHalf, fuse_rotary, fused_apply_rotary, reproduces
from hybridflow.models.tiny import build_tiny_model

BF16 = torch.bfloat16


@pytest.fixture
def restore_rotary():
    """fuse_rotary changes a modeling module's global: start from HF's originals (an earlier test's training step may
    have installed the fused one in this process) and put back what was there after the test."""
    saved = {name: module.apply_rotary_pos_emb for name, module in list(sys.modules.items())
             if name.startswith("transformers.models.") and hasattr(module, "apply_rotary_pos_emb")}
    for name, function in saved.items():
        sys.modules[name].apply_rotary_pos_emb = getattr(function, "hybridflow_original", function)
    yield
    for name, function in saved.items():
        sys.modules[name].apply_rotary_pos_emb = function


def test_rotation_and_its_gradient_by_hand():
    """x = (1, 2), cos = (1/2, 1/2), sin = (1/4, 1/4): y = (1/2 - 2/4, 2/2 + 1/4) = (0, 1.25); for upstream g = (1, 3):
    dx1 = g1 c + g2 s = 1/2 + 3/4 = 1.25, dx2 = g2 c - g1 s = 3/2 - 1/4 = 1.25 (all exact in bf16)."""
    x = torch.tensor([[1.0, 2.0]], dtype=BF16, requires_grad=True)
    cos, sin = torch.full((1, 2), 0.5), torch.full((1, 2), 0.25)
    y = RotateHalf.apply(x, cos, sin, BF16)
    assert y.dtype == BF16 and y.tolist() == [[0.0, 1.25]]
    y.backward(torch.tensor([[1.0, 3.0]], dtype=BF16))
    assert x.grad.dtype == BF16 and x.grad.tolist() == [[1.25, 1.25]]


def test_rotation_matches_an_fp64_reference_within_bf16_rounding():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 7, 16, generator=gen)
    angles = torch.randn(2, 1, 7, 8, generator=gen, dtype=torch.float64)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    upstream = torch.randn(2, 3, 7, 16, generator=gen)
    x64 = x.to(BF16).double().requires_grad_()
    reference = x64 * cos + modeling_llama.rotate_half(x64) * sin
    reference.backward(upstream.to(BF16).double())
    x16 = x.to(BF16).requires_grad_()
    out = RotateHalf.apply(x16, cos.float(), sin.float(), BF16)
    out.backward(upstream.to(BF16))
    # one bf16 rounding of the output; the gradient: two rounded products and a rounded sum (|terms| <~ 4)
    torch.testing.assert_close(out.double(), reference.detach(), atol=0, rtol=2**-8)
    assert (x16.grad.double() - x64.grad).abs().max() <= 3 * 2**-8 * 4


@pytest.mark.parametrize("q_dtype", [BF16, torch.float32])  # fp32: a model that normalises q / k (Qwen3)
def test_same_bits_as_hfs_rotary_under_autocast(q_dtype):
    """HF's llama rotary against the fused one on the shapes a decoder layer gives it: q / k transposed views of a
    projection's output, cos / sin of the rotary module; outputs (cast to bf16, as the attention call does) and the
    gradients of q and k equal bit for bit."""
    gen = torch.Generator().manual_seed(2)
    tokens, heads, kv_heads, dim = 11, 4, 2, 16
    projected = torch.randn(1, tokens, (heads + kv_heads) * dim, generator=gen).to(q_dtype)
    angles = torch.randn(1, tokens, dim // 2, generator=gen) * 5
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    upstream = [torch.randn(1, h, tokens, dim, generator=gen).to(BF16) for h in (heads, kv_heads)]
    results = []
    for function in (modeling_llama.apply_rotary_pos_emb, fused_apply_rotary(modeling_llama.apply_rotary_pos_emb)):
        leaf = projected.clone().requires_grad_()
        q, k = (part.view(1, tokens, -1, dim).transpose(1, 2) for part in leaf.split([heads * dim, kv_heads * dim], -1))
        with torch.autocast("cpu", dtype=BF16):
            outs = [out.to(BF16) for out in function(q, k, cos, sin)]
        torch.autograd.backward(outs, upstream)
        results.append((outs, leaf.grad))
    (hf_outs, hf_grad), (fused_outs, fused_grad) = results
    assert all(torch.equal(a, b) for a, b in zip(hf_outs, fused_outs))
    assert torch.equal(hf_grad, fused_grad)


def test_outside_autocast_the_original_runs():
    calls = []

    def original(q, k, cos, sin, unsqueeze_dim=1):
        calls.append(unsqueeze_dim)
        return q, k

    q = torch.ones(1, 1, 2, 4)
    fused_apply_rotary(original)(q, q, torch.ones(1, 2, 4), torch.ones(1, 2, 4))
    assert calls == [1]


def test_a_function_that_differs_is_not_replaced():
    def shifted(q, k, cos, sin, unsqueeze_dim=1):  # HF's signature, other arithmetic
        return modeling_llama.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)[0] + 1, k

    assert reproduces(modeling_llama.apply_rotary_pos_emb, fused_apply_rotary(modeling_llama.apply_rotary_pos_emb))
    assert not reproduces(shifted, fused_apply_rotary(shifted))


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
def test_a_model_computes_the_same_bits_with_the_fused_rotary(architecture, restore_rotary):
    plain, _ = build_tiny_model(architecture, seed=0)
    fused = copy.deepcopy(plain)
    ids = torch.randint(0, plain.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    results = []
    for model, install in ((plain, False), (fused, True)):
        if install:
            assert fuse_rotary(model) == 1 and fuse_rotary(model) == 0  # idempotent
        with torch.autocast("cpu", dtype=BF16):
            logits = model(input_ids=ids).logits.float()
        torch.log_softmax(logits, -1)[..., 0].sum().backward()
        results.append((logits, {name: p.grad for name, p in model.named_parameters()}))
    (plain_logits, plain_grads), (fused_logits, fused_grads) = results
    module = sys.modules[type(fused.model.layers[0].self_attn).__module__]
    assert hasattr(module.apply_rotary_pos_emb, "hybridflow_original")
    assert torch.equal(plain_logits, fused_logits)
    assert all(torch.equal(plain_grads[name], fused_grads[name]) for name in plain_grads)

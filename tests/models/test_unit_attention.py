"""The masked unit attention a CPU runs in bf16 (hybridflow.models.unit_attention): the same attention as SDPA under
the unit's mask (exact in fp64: GQA grouping, scale, mask, every gradient), bf16 as close to fp64 as SDPA's flash
kernel, and what a bf16 shared-prompt forward takes on a CPU."""

import pytest
import torch

from hybridflow.data.packing import _shared_prompt_mask
from hybridflow.models import unit_attention
from hybridflow.models.unit_attention import masked_unit_attention, takes_unit_attention

SDPA = torch.nn.functional.scaled_dot_product_attention


def unit_inputs(dtype, *, prompt=5, responses=(3, 0, 4), heads=6, kv_heads=2, dim=8, seed=1):
    gen = torch.Generator().manual_seed(seed)
    length = prompt + sum(responses)
    qkv = [torch.randn(1, h, length, dim, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()
           for h in (heads, kv_heads, kv_heads)]
    weights = torch.randn(1, heads, length, dim, generator=gen, dtype=torch.float64)
    return qkv, _shared_prompt_mask(prompt, list(responses)), weights


def test_equals_sdpa_under_the_mask_in_fp64():
    # 6 query heads over 2 KV heads, a prompt of 5 and responses of 3, 0 (empty) and 4, scale 0.3
    qkv, mask, weights = unit_inputs(torch.float64)
    expected = SDPA(*qkv, attn_mask=mask, scale=0.3, enable_gqa=True)
    expected_grads = torch.autograd.grad((expected * weights).sum(), qkv)
    got = masked_unit_attention(*qkv, mask, 0.3)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    for grad, want in zip(torch.autograd.grad((got * weights).sum(), qkv), expected_grads):
        torch.testing.assert_close(grad, want, rtol=0, atol=1e-12)


def test_default_scale_is_one_over_root_head_dim():
    qkv, mask, _ = unit_inputs(torch.float64, heads=2, kv_heads=2)
    torch.testing.assert_close(masked_unit_attention(*qkv, mask, None), SDPA(*qkv, attn_mask=mask),
                               rtol=0, atol=1e-12)


def relative_errors(dtype_outputs, exact_outputs):
    return [((got.double() - want).norm() / want.norm()).item() for got, want in zip(dtype_outputs, exact_outputs)]


def test_bf16_is_as_close_to_fp64_as_sdpa():
    # a unit of the GRPO benchmark's size: prompt 40, four responses, 9 heads over 3, head dim 64
    qkv64, mask, weights = unit_inputs(torch.float64, prompt=40, responses=(50, 31, 64, 45), heads=9, kv_heads=3,
                                       dim=64, seed=2)
    exact = SDPA(*qkv64, attn_mask=mask, enable_gqa=True)
    exact_all = (exact, *torch.autograd.grad((exact * weights).sum(), qkv64))
    qkv = [t.detach().to(torch.bfloat16).requires_grad_() for t in qkv64]
    weights = weights.to(torch.bfloat16)
    errors = {}
    for name, fn in (("sdpa", lambda: SDPA(*qkv, attn_mask=mask, enable_gqa=True)),
                     ("unit", lambda: masked_unit_attention(*qkv, mask, None))):
        out = fn()
        errors[name] = relative_errors((out, *torch.autograd.grad((out * weights).sum(), qkv)), exact_all)
    assert max(errors["unit"]) < 1e-2, errors
    for unit, sdpa in zip(errors["unit"], errors["sdpa"]):
        assert unit < 2 * sdpa, errors


def test_which_units_take_it():
    mask = torch.ones(4, 4, dtype=torch.bool).tril()
    bf16 = torch.zeros(1, 2, 4, 8, dtype=torch.bfloat16)
    assert takes_unit_attention(bf16, mask, 0.0)
    assert not takes_unit_attention(bf16.float(), mask, 0.0)  # fp32: SDPA, the bits fp32 pins hold
    assert not takes_unit_attention(bf16.half(), mask, 0.0)  # fp16: not measured here
    assert not takes_unit_attention(bf16, torch.zeros(4, 4), 0.0)  # an additive mask: SDPA
    assert not takes_unit_attention(bf16, None, 0.0)  # a causal unit: SDPA's causal kernel skips the masked tiles
    assert not takes_unit_attention(bf16, mask, 0.1)
    long = torch.zeros(1, 2, unit_attention.MAX_UNIT_TOKENS + 1, 8, dtype=torch.bfloat16)
    assert not takes_unit_attention(long, torch.ones(long.shape[2], long.shape[2], dtype=torch.bool), 0.0)


@pytest.mark.parametrize("limit", [unit_attention.MAX_UNIT_TOKENS, 0])
def test_bf16_shared_prompt_forward_on_a_cpu_takes_it(tiny_tokenizer, monkeypatch, limit):
    """A shared-prompt packed forward under bf16 autocast runs its masked units here (none with the limit at 0), and
    its log-probs equal the padded forward's to bf16 rounding."""
    from hybridflow.data.packing import PackedResponses
    from hybridflow.models import build_tiny_model, compute_log_probs, packed_log_probs
    from hybridflow.models import segment_attention
    from tests.models.test_segment_attention import PROMPT_COLS, RESPONSE_COLS, grpo_like_rows

    calls = []
    monkeypatch.setattr(unit_attention, "MAX_UNIT_TOKENS", limit)
    monkeypatch.setattr(segment_attention, "masked_unit_attention",
                        lambda *a: calls.append(a[0].shape) or masked_unit_attention(*a))
    model, _ = build_tiny_model("qwen2", seed=1, tokenizer=tiny_tokenizer)
    input_ids, attention_mask, position_ids = grpo_like_rows(model.config.vocab_size)
    valid = attention_mask[:, PROMPT_COLS:].bool()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        padded, _ = compute_log_probs(model, input_ids=input_ids, attention_mask=attention_mask,
                                      position_ids=position_ids, response_length=RESPONSE_COLS)
        packed, _ = packed_log_probs(model, PackedResponses(input_ids, attention_mask, response_length=RESPONSE_COLS,
                                                            share_prompt=True))
    layers = model.config.num_hidden_layers
    assert len(calls) == (2 * layers if limit else 0)  # two shared-prompt units (the third prompt has one sample)
    torch.testing.assert_close(packed[valid].float(), padded[valid].float(), rtol=0.05, atol=0.05)

"""The masked unit attention a CPU runs in bf16 (hybridflow.models.unit_attention), dense and block-sparse: the same
attention as SDPA under the unit's mask (exact in fp64: GQA grouping, scale, mask, every gradient), bf16 as close to
fp64 as SDPA's flash kernel, and what a shared-prompt forward takes on a CPU."""

import pytest
import torch

from hybridflow.data.packing import _shared_prompt_mask
from hybridflow.models import unit_attention
from hybridflow.models.unit_attention import (kept_scores, masked_unit_attention, shared_prompt_blocks,
                                              takes_unit_attention)

SDPA = torch.nn.functional.scaled_dot_product_attention


def unit_inputs(dtype, *, prompt=5, responses=(3, 0, 4), heads=6, kv_heads=2, dim=8, seed=1, token_major=False):
    """q / k / v ``[1, H, L, D]`` leaves (``token_major``: views of ``[1, L, H, D]`` memory, as HF's projections lay
    them out), the unit's mask and output weights."""
    gen = torch.Generator().manual_seed(seed)
    length = prompt + sum(responses)
    qkv = [(torch.randn(1, length, h, dim, generator=gen, dtype=torch.float64).to(dtype).transpose(1, 2)
            if token_major else torch.randn(1, h, length, dim, generator=gen, dtype=torch.float64).to(dtype))
           for h in (heads, kv_heads, kv_heads)]
    qkv = [tensor.detach().requires_grad_() for tensor in qkv]
    weights = torch.randn(1, heads, length, dim, generator=gen, dtype=torch.float64)
    return qkv, _shared_prompt_mask(prompt, list(responses)), weights


def assert_equals_sdpa(qkv, mask, weights, branches, backward_name):
    """Output and q / k / v gradients of the unit function against SDPA under the mask, in fp64; ``backward_name``:
    the autograd node that must have run (dense or block-sparse)."""
    expected = SDPA(*qkv, attn_mask=mask, scale=0.3, enable_gqa=True)
    expected_grads = torch.autograd.grad((expected * weights).sum(), qkv)
    got = masked_unit_attention(*qkv, mask, 0.3, branches)
    assert type(got.grad_fn).__name__ == backward_name
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    for grad, want, name in zip(torch.autograd.grad((got * weights).sum(), qkv), expected_grads, "qkv"):
        torch.testing.assert_close(grad, want, rtol=0, atol=1e-12, msg=name)


def test_equals_sdpa_under_the_mask_in_fp64():
    # 6 query heads over 2 KV heads, a prompt of 5 and responses of 3, 0 (empty) and 4, scale 0.3: every score
    assert_equals_sdpa(*unit_inputs(torch.float64), None, "_MaskedUnitAttentionBackward")


STRUCTURES = [(5, (3, 0, 4)), (1, (1,)), (1, (4, 2)), (6, (7,)), (3, (2, 9, 1, 5, 3, 8, 4, 6)), (4, (5, 5, 5)),
              (9, (0, 3))]


@pytest.mark.parametrize("prompt, responses", STRUCTURES)
@pytest.mark.parametrize("heads, kv_heads, dim", [(6, 2, 16), (2, 2, 16), (3, 1, 64)])
@pytest.mark.parametrize("token_major", [False, True])
def test_block_sparse_equals_sdpa_under_the_mask_in_fp64(prompt, responses, heads, kv_heads, dim, token_major):
    """The shared-prompt blocks (the prompt causal, each response padded to the longest against the prompt and
    itself) are the dense masked attention: 1 to 8 ragged responses (empty ones too), a one-token prompt, GQA
    groups 3 / 1, head dims 16 / 64, q / k / v as plain or as HF's token-major views."""
    qkv, mask, weights = unit_inputs(torch.float64, prompt=prompt, responses=responses, heads=heads,
                                     kv_heads=kv_heads, dim=dim, seed=prompt + len(responses), token_major=token_major)
    assert_equals_sdpa(qkv, mask, weights, [prompt, *responses], "_SharedPromptUnitAttentionBackward")


@pytest.mark.parametrize("branches", [None, [5, 3, 0, 3], [0, 12], [12], [5, 0, 0, 0]])
def test_a_structure_that_is_not_the_units_takes_every_score(branches):
    """No structure, one that does not add up to the unit, no prompt, or no response: the dense masked path (the
    mask is all it reads)."""
    qkv, mask, weights = unit_inputs(torch.float64)
    assert_equals_sdpa(qkv, mask, weights, branches, "_MaskedUnitAttentionBackward")


def test_the_blocks_and_their_kept_scores():
    assert shared_prompt_blocks(12, [5, 3, 0, 4]) == [5, 3, 4]  # an empty response has no block
    assert shared_prompt_blocks(12, [5, 3, 0, 3]) is None  # 11 tokens, not the unit's 12
    assert shared_prompt_blocks(12, None) is None and shared_prompt_blocks(12, [0, 12]) is None
    assert shared_prompt_blocks(5, [5, 0]) is None and shared_prompt_blocks(5, [5]) is None
    assert kept_scores(12, [5, 3, 0, 4]) == 5 * 5 + 2 * 4 * (5 + 4)  # prompt^2 + n R (P + R), R the longest
    assert kept_scores(12) == kept_scores(12, [5, 3, 0, 3]) == 144
    # the GRPO benchmark's unit: prompt 40, four responses up to 64 tokens: 28,224 scores against 57,600 dense
    assert kept_scores(240, [40, 50, 50, 50, 50]) == 40 * 40 + 4 * 50 * 90 < 240 * 240


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
                     ("unit", lambda: masked_unit_attention(*qkv, mask, None)),
                     ("blocks", lambda: masked_unit_attention(*qkv, mask, None, [40, 50, 31, 64, 45]))):
        out = fn()
        errors[name] = relative_errors((out, *torch.autograd.grad((out * weights).sum(), qkv)), exact_all)
    for name in ("unit", "blocks"):
        assert max(errors[name]) < 1e-2, errors
        for unit, sdpa in zip(errors[name], errors["sdpa"]):
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
    long, full = torch.zeros(1, 2, 600, 8, dtype=torch.bfloat16), torch.ones(600, 600, dtype=torch.bool)
    assert unit_attention.MAX_KEPT_SCORES == 512 * 512 < 600 * 600
    assert not takes_unit_attention(long, full, 0.0)  # every score: SDPA's flash kernel
    # the same 600 tokens as a prompt and four responses keep 40^2 + 4 140 (40 + 140) scores: block-sparse
    assert takes_unit_attention(long, full, 0.0, [40, 140, 140, 140, 140])
    assert not takes_unit_attention(long, full, 0.0, [40, 560])  # 40^2 + 560 600 scores


def shared_prompt_model_run(tiny_tokenizer, monkeypatch, *, arch="qwen2", precision="bf16", limit=None):
    """Log-probs and gradients of the padded and the shared-prompt forward (GRPO-like rows: two shared-prompt units
    and a lone prompt) under ``precision``, and the structure each unit attention call got (``limit``: the kept-scores
    limit; ``precision="fp32"`` lets fp32 take the unit path too, so its gradients compare at fp32 rounding)."""
    from hybridflow.data.packing import PackedResponses
    from hybridflow.models import build_tiny_model, compute_log_probs, packed_log_probs
    from hybridflow.models import segment_attention
    from tests.models.test_segment_attention import PROMPT_COLS, RESPONSE_COLS, grads, grpo_like_rows

    calls = []
    if limit is not None:
        monkeypatch.setattr(unit_attention, "MAX_KEPT_SCORES", limit)
    if precision == "fp32":
        monkeypatch.setattr(unit_attention, "REDUCED_DTYPES", (torch.float32,))
    monkeypatch.setattr(segment_attention, "masked_unit_attention",
                        lambda *a: calls.append(a[5]) or masked_unit_attention(*a))
    model, _ = build_tiny_model(arch, seed=1, tokenizer=tiny_tokenizer)
    model.train()
    input_ids, attention_mask, position_ids = grpo_like_rows(model.config.vocab_size)
    valid = attention_mask[:, PROMPT_COLS:].bool()
    weights = torch.randn(valid.shape, generator=torch.Generator().manual_seed(3))
    runs = []
    for share_prompt in (None, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            if share_prompt is None:
                log_probs, _ = compute_log_probs(model, input_ids=input_ids, attention_mask=attention_mask,
                                                 position_ids=position_ids, response_length=RESPONSE_COLS)
            else:
                log_probs, _ = packed_log_probs(model, PackedResponses(input_ids, attention_mask,
                                                                       response_length=RESPONSE_COLS,
                                                                       share_prompt=True))
            (log_probs.float() * weights * valid).sum().backward()
        runs.append((log_probs[valid].float(), grads(model)))
    return runs, calls, model.config.num_hidden_layers


@pytest.mark.parametrize("limit", [None, 0])
def test_bf16_shared_prompt_forward_on_a_cpu_takes_the_blocks(tiny_tokenizer, monkeypatch, limit):
    """A shared-prompt packed forward under bf16 autocast runs its units block-sparse (none with the limit at 0), and
    its log-probs and gradients equal the padded forward's to bf16 rounding."""
    ((padded, expected), (packed, got)), calls, layers = shared_prompt_model_run(tiny_tokenizer, monkeypatch,
                                                                              limit=limit)
    # two shared-prompt units a layer (the third prompt has one sample), each with its structure
    assert len(calls) == (2 * layers if limit is None else 0)
    assert all(structure is not None and len(structure) == 4 for structure in calls)
    torch.testing.assert_close(packed, padded, rtol=0.05, atol=0.05)
    assert got.keys() == expected.keys()
    for name in expected:
        scale = expected[name].abs().max().item()
        torch.testing.assert_close(got[name] / scale, expected[name] / scale, rtol=0.05, atol=0.05, msg=name)


@pytest.mark.parametrize("arch", ["qwen2", "mistral"])
def test_fp32_shared_prompt_model_through_the_unit_path_equals_padded(tiny_tokenizer, monkeypatch, arch):
    """fp32 let through the unit path: the whole model's log-probs and every gradient equal the padded forward's to
    fp32 rounding, block-sparse (qwen2) and, where a sliding window narrows the mask (mistral), dense: a window's
    mask is not the structure's, so no structure is passed."""
    ((padded, expected), (packed, got)), calls, layers = shared_prompt_model_run(tiny_tokenizer, monkeypatch,
                                                                              arch=arch, precision="fp32")
    # a window masks the lone prompt's causal unit too: three masked units a layer
    assert len(calls) == (3 if arch == "mistral" else 2) * layers
    assert all((structure is None) == (arch == "mistral") for structure in calls)
    torch.testing.assert_close(packed, padded, rtol=0, atol=2e-5)
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=2e-5, msg=name)

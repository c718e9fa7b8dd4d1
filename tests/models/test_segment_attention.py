"""Padding-free and shared-prompt forwards equal the padded forward: log-probs, entropy, values
and gradients, on every architecture of the native engine's table (Gemma's soft-capping and every sliding
window included), with and without activation checkpointing."""

import pytest
import torch

from hybridflow.data.packing import PackedResponses
from hybridflow.models import ValueModel, build_tiny_model, compute_log_probs, packed_log_probs
from hybridflow.models.logprob import packed_forward_inputs
from hybridflow.models.tiny import TINY_ARCHITECTURES

PROMPT_COLS, RESPONSE_COLS = 7, 6


def grpo_like_rows(vocab: int, *, groups=((5, 3), (7, 3), (4, 1)), seed: int = 0):
    """``input_ids, attention_mask, position_ids`` ``[B, 13]``: left-padded prompts, each repeated for
    its group's samples, followed by right-padded responses of random lengths (1..6)."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for prompt_len, samples in groups:
        prompt = torch.randint(5, vocab, (prompt_len,), generator=gen)
        for _ in range(samples):
            response = torch.randint(5, vocab, (int(torch.randint(1, RESPONSE_COLS + 1, (), generator=gen)),),
                                     generator=gen)
            ids = torch.zeros(PROMPT_COLS + RESPONSE_COLS, dtype=torch.long)
            ids[PROMPT_COLS - prompt_len:PROMPT_COLS] = prompt
            ids[PROMPT_COLS:PROMPT_COLS + response.numel()] = response
            mask = torch.zeros_like(ids)
            mask[PROMPT_COLS - prompt_len:PROMPT_COLS + response.numel()] = 1
            rows.append((ids, mask))
    input_ids = torch.stack([r[0] for r in rows])
    attention_mask = torch.stack([r[1] for r in rows])
    return input_ids, attention_mask, (attention_mask.cumsum(-1) - 1).clamp(min=0)


def grads(model) -> dict[str, torch.Tensor]:
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return out


@pytest.mark.parametrize("arch, checkpointing", [(arch, False) for arch in TINY_ARCHITECTURES]
                         + [("llama", True), ("gemma2", True), ("mixtral", True)])
def test_packed_and_shared_prompt_log_probs_and_gradients_equal_padded(tiny_tokenizer, arch, checkpointing):
    model, _ = build_tiny_model(arch, seed=1, tokenizer=tiny_tokenizer)
    if checkpointing:  # the recompute in backward must see the same segments as the forward
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    input_ids, attention_mask, position_ids = grpo_like_rows(model.config.vocab_size)
    valid = attention_mask[:, PROMPT_COLS:].bool()
    weights = torch.randn(valid.shape, generator=torch.Generator().manual_seed(3))  # a loss that weighs tokens

    padded, padded_entropy = compute_log_probs(model, input_ids=input_ids, attention_mask=attention_mask,
                                               position_ids=position_ids, response_length=RESPONSE_COLS,
                                               temperature=0.7, calculate_entropy=True)
    ((padded + padded_entropy) * weights * valid).sum().backward()
    expected = grads(model)
    for share_prompt in (False, True):
        packed = PackedResponses(input_ids, attention_mask, response_length=RESPONSE_COLS, share_prompt=share_prompt)
        log_probs, entropy = packed_log_probs(model, packed, temperature=0.7, calculate_entropy=True)
        torch.testing.assert_close(log_probs[valid], padded[valid], rtol=0, atol=2e-5)
        torch.testing.assert_close(entropy[valid], padded_entropy[valid], rtol=0, atol=2e-5)
        assert (log_probs[~valid] == 0).all() and (entropy[~valid] == 0).all()
        ((log_probs + entropy) * weights * valid).sum().backward()
        got = grads(model)
        assert got.keys() == expected.keys()
        for name in expected:
            torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=2e-5, msg=name)


def test_shared_prompt_row_is_shorter_by_the_repeated_prompts(tiny_tokenizer):
    input_ids, attention_mask, _ = grpo_like_rows(500)
    unshared = PackedResponses(input_ids, attention_mask, response_length=RESPONSE_COLS, share_prompt=False)
    shared = PackedResponses(input_ids, attention_mask, response_length=RESPONSE_COLS, share_prompt=True)
    # groups (5 tokens x 3 samples), (7 x 3), (4 x 1): two extra copies of the first two prompts are saved
    assert unshared.input_ids.shape[1] - shared.input_ids.shape[1] == 2 * 5 + 2 * 7
    assert unshared.input_ids.shape[1] == int(attention_mask.sum())


def test_packed_values_equal_padded_values(tiny_tokenizer):
    backbone, _ = build_tiny_model("llama", seed=2, tokenizer=tiny_tokenizer)
    model = ValueModel(backbone.model)
    torch.nn.init.normal_(model.value_head.weight, std=0.5)  # a zero head would hide any mismatch
    input_ids, attention_mask, position_ids = grpo_like_rows(backbone.config.vocab_size, seed=5)
    valid = attention_mask[:, PROMPT_COLS:].bool()
    padded = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    padded = padded[:, PROMPT_COLS - 1:-1]  # V(s_t) is read at the position before token t
    for share_prompt in (False, True):
        packed = PackedResponses(input_ids, attention_mask, response_length=RESPONSE_COLS, share_prompt=share_prompt)
        values = packed.scatter(model(**packed_forward_inputs(model, packed))[0, packed.source])
        torch.testing.assert_close(values[valid], padded[valid], rtol=0, atol=2e-5)


def test_without_a_layout_the_switched_model_is_plain_sdpa(tiny_tokenizer):
    """Generation and the padded path keep working after a model has run packed forwards."""
    model, _ = build_tiny_model("llama", seed=1, tokenizer=tiny_tokenizer)
    input_ids, attention_mask, position_ids = grpo_like_rows(model.config.vocab_size)
    before = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    packed_log_probs(model, PackedResponses(input_ids, attention_mask, response_length=RESPONSE_COLS,
                                            share_prompt=True))
    assert model.config._attn_implementation == "hybridflow_segments"
    after = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    torch.testing.assert_close(after, before, rtol=0, atol=1e-6)
    generated = model.generate(input_ids[:1, 2:PROMPT_COLS], max_new_tokens=3, do_sample=False)
    assert generated.shape == (1, PROMPT_COLS - 2 + 3)


def test_repeated_kv_heads_equal_enable_gqa_under_a_mask():
    # The CUDA path of a masked (shared-prompt) unit repeats the KV heads; same attention as enable_gqa.
    from hybridflow.models.segment_attention import kv_heads

    gen = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(1, heads, 9, 8, generator=gen) for heads in (6, 2, 2))
    mask = torch.rand(9, 9, generator=gen) > 0.3
    mask.fill_diagonal_(True)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    grouped_key, grouped_value, gqa = kv_heads(query, key, value, repeat=False)
    expected = sdpa(query, grouped_key, grouped_value, attn_mask=mask, enable_gqa=gqa)
    repeated_key, repeated_value, gqa = kv_heads(query, key, value, repeat=True)
    assert not gqa and repeated_key.shape[1] == 6
    torch.testing.assert_close(sdpa(query, repeated_key, repeated_value, attn_mask=mask, enable_gqa=gqa), expected)


@pytest.mark.parametrize("repeat_kv", [False, True])
def test_shared_prompt_branches_equal_the_masked_unit(repeat_kv):
    # What a GPU runs for a shared-prompt unit (fused causal calls per branch) against its mask, values and
    # gradients: prompt 5, responses 3, 0 (an empty one) and 4; 6 query heads over 2 KV heads.
    from hybridflow.data.packing import _shared_prompt_mask
    from hybridflow.models.segment_attention import shared_prompt_attention

    lengths = [5, 3, 0, 4]
    gen = torch.Generator().manual_seed(1)
    qkv = [torch.randn(1, heads, 12, 8, generator=gen, dtype=torch.float64, requires_grad=True) for heads in (6, 2, 2)]
    weights = torch.randn(1, 6, 12, 8, generator=gen, dtype=torch.float64)
    expected = torch.nn.functional.scaled_dot_product_attention(
        *qkv, attn_mask=_shared_prompt_mask(5, [3, 0, 4]), scale=0.3, enable_gqa=True)
    expected_grads = torch.autograd.grad((expected * weights).sum(), qkv)
    got = shared_prompt_attention(*qkv, lengths=lengths, scale=0.3, repeat_kv=repeat_kv)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    for grad, want in zip(torch.autograd.grad((got * weights).sum(), qkv), expected_grads):
        torch.testing.assert_close(grad, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("arch", ["gemma2", "mistral"])
def test_padded_forward_under_segment_attention_equals_the_models_own(tiny_tokenizer, arch):
    """Switched to segment attention, a padded batch (no layout) still caps Gemma 2's scores and keeps
    each layer's window: the same logits as the model's own attention implementation."""
    from hybridflow.models.segment_attention import use_segment_attention

    model, _ = build_tiny_model(arch, seed=1, tokenizer=tiny_tokenizer)
    input_ids, attention_mask, position_ids = grpo_like_rows(model.config.vocab_size)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    with torch.no_grad():
        own = model(**inputs).logits
        use_segment_attention(model)
        segments = model(**inputs).logits
    valid = attention_mask.bool()
    torch.testing.assert_close(segments[valid], own[valid], rtol=0, atol=2e-5)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_branched_shared_prompt_forward_equals_padded_under_autocast(tiny_tokenizer, monkeypatch, precision):
    """The branch-by-branch shared-prompt attention (what a GPU runs with ``fast-branched``), switched on for the
    CPU, inside a whole model: under bf16 autocast the rotary embedding leaves q/k in fp32 and v in bf16, which
    the bottom-right causal bias's fused dispatch rejected ("Expected query, key, and value to have the same
    dtype"); the log-probs and gradients equal the padded forward's (fp32 to float rounding, bf16 to bf16's)."""
    from hybridflow.models import segment_attention

    model, _ = build_tiny_model("qwen2", seed=1, tokenizer=tiny_tokenizer)
    model.train()
    input_ids, attention_mask, position_ids = grpo_like_rows(model.config.vocab_size)
    valid = attention_mask[:, PROMPT_COLS:].bool()
    weights = torch.randn(valid.shape, generator=torch.Generator().manual_seed(3))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    tolerance = dict(rtol=0, atol=2e-5) if precision == "fp32" else dict(rtol=0.05, atol=0.05)
    with autocast:
        padded, _ = compute_log_probs(model, input_ids=input_ids, attention_mask=attention_mask,
                                      position_ids=position_ids, response_length=RESPONSE_COLS, temperature=0.7)
        (padded.float() * weights * valid).sum().backward()
    expected = grads(model)
    monkeypatch.setattr(segment_attention, "BRANCHED_SHARED_PROMPTS_DEVICES", ("cpu",))
    packed = PackedResponses(input_ids, attention_mask, response_length=RESPONSE_COLS, share_prompt=True)
    with autocast:
        log_probs, _ = packed_log_probs(model, packed, temperature=0.7)
        (log_probs.float() * weights * valid).sum().backward()
    torch.testing.assert_close(log_probs[valid].float(), padded[valid].float(), **tolerance)
    got = grads(model)
    assert got.keys() == expected.keys()
    for name in expected:
        scale = expected[name].abs().max().item() if precision == "bf16" else 1.0
        torch.testing.assert_close(got[name] / scale, expected[name] / scale,
                                   **(dict(rtol=1e-4, atol=2e-5) if precision == "fp32" else tolerance), msg=name)


def test_split_units_are_the_units_and_their_gradient_lands_in_place():
    """One split for bounds that tile the row (a trailing padding unit left out), slices otherwise; each unit's
    gradient reaches its own columns only."""
    from hybridflow.models.segment_attention import split_units

    row = torch.arange(2 * 7 * 1, dtype=torch.float32).reshape(1, 2, 7, 1).requires_grad_()
    units = split_units(row, [(0, 3), (3, 5)])  # tiles [0, 5); columns 5, 6 are padding
    assert [u.shape[-2] for u in units] == [3, 2]
    assert units[1][0, 0, :, 0].tolist() == [3.0, 4.0]
    (units[0].sum() * 2 + units[1].sum() * 3).backward()
    assert row.grad[0, 0, :, 0].tolist() == [2.0, 2.0, 2.0, 3.0, 3.0, 0.0, 0.0]
    gapped = split_units(row, [(0, 2), (4, 6)])  # not contiguous: slices
    assert gapped[1][0, 1, :, 0].tolist() == [11.0, 12.0]


def test_split_units_of_a_row_laid_out_token_major_are_the_same_units():
    """A ``[1, H, N, D]`` view of ``[1, N, H, D]`` memory (HF's transposed projections) is split in that memory:
    same values, same gradient as the plain slices."""
    from hybridflow.models.segment_attention import split_units

    memory = torch.arange(1 * 5 * 2 * 3, dtype=torch.float32).reshape(1, 5, 2, 3).requires_grad_()
    row = memory.transpose(1, 2)  # [1, H=2, N=5, D=3]
    units = split_units(row, [(0, 2), (2, 4)])
    assert [u.shape for u in units] == [torch.Size([1, 2, 2, 3])] * 2
    assert torch.equal(units[1], row[:, :, 2:4])
    (units[0].sum() + 5 * units[1].sum()).backward()
    assert memory.grad[0, :, 0, 0].tolist() == [1.0, 1.0, 5.0, 5.0, 0.0]

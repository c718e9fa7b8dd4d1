"""One FlexAttention call per packed row (hybridflow.models.flex_segments) computes the per-unit attention: its rule
equals every unit's mask (shared prompts, plain units, sliding windows), and a whole model's log-probs through it
equal the padded forward's. The CPU has FlexAttention's forward only; the gradient test runs on a GPU."""

import warnings

import pytest
import torch

from hybridflow.data.packing import PackedResponses
from hybridflow.models import build_tiny_model, compute_log_probs, packed_log_probs, segment_attention
from hybridflow.models.flex_segments import RowRoles, expressible
from hybridflow.models.segment_attention import SegmentLayout, windowed
from tests.models.test_segment_attention import PROMPT_COLS, RESPONSE_COLS, grads, grpo_like_rows


def dense_rule(layout: SegmentLayout, positions: torch.Tensor | None, window: int | None) -> torch.Tensor:
    """``[N, N]`` bool: :class:`RowRoles`' mask_mod evaluated at every (query, key) pair."""
    roles = RowRoles.of(layout, positions, torch.device("cpu"))
    length = layout.bounds[-1][1]
    query, key = torch.arange(length)[:, None], torch.arange(length)[None, :]
    return roles.mask_mod(window)(0, 0, query, key)


def per_unit_masks(layout: SegmentLayout, positions: torch.Tensor, window: int | None) -> torch.Tensor:
    """``[N, N]`` bool: the layout's own masks (None: causal) on the block diagonal, windowed as the per-unit path
    windows them."""
    length = layout.bounds[-1][1]
    dense = torch.zeros(length, length, dtype=torch.bool)
    for (start, end), mask in zip(layout.bounds, layout.masks):
        unit = mask if mask is not None else torch.ones(end - start, end - start, dtype=torch.bool).tril()
        if window is not None:
            unit = windowed(mask, positions[start:end], window)
        dense[start:end, start:end] = unit
    return dense


@pytest.mark.parametrize("window", [None, 3, 8])
@pytest.mark.parametrize("share_prompt", [False, True])
def test_the_rule_is_every_units_mask(share_prompt, window):
    input_ids, attention_mask, _ = grpo_like_rows(500, groups=((5, 3), (7, 3), (4, 1), (6, 2)))
    packed = PackedResponses(input_ids, attention_mask, response_length=RESPONSE_COLS, share_prompt=share_prompt)
    layout = SegmentLayout(packed.bounds, packed.masks, packed.branches)
    positions = packed.position_ids[0]
    expected = per_unit_masks(layout, positions, window)
    assert torch.equal(dense_rule(layout, positions, window), expected)
    # The layout's own positions are what the per-unit path derives when the forward has none.
    assert torch.equal(dense_rule(layout, None, window), expected)
    causal_units = sum((end - start) * (end - start + 1) // 2 for start, end in layout.bounds)
    if share_prompt and window is None:  # the case the rule exists for: a response never sees another response
        assert expected.sum() < causal_units


def test_a_masked_unit_without_branch_lengths_or_dropout_keeps_the_per_unit_path():
    mask = torch.ones(4, 4, dtype=torch.bool).tril()
    assert expressible(SegmentLayout([(0, 4)], [None], None), dropout=0.0)
    assert expressible(SegmentLayout([(0, 4)], [mask], [[2, 1, 1]]), dropout=0.0)
    assert not expressible(SegmentLayout([(0, 4)], [mask], None), dropout=0.0)
    assert not expressible(SegmentLayout([(0, 4)], [mask], [None]), dropout=0.0)
    assert not expressible(SegmentLayout([(0, 4)], [None], None), dropout=0.1)


@pytest.mark.parametrize("arch", ["qwen2", "mistral", "gemma2", "qwen3_moe"])
@pytest.mark.parametrize("share_prompt", [False, True])
def test_flex_log_probs_equal_padded_on_cpu(tiny_tokenizer, monkeypatch, arch, share_prompt):
    """Forward only (the CPU has no FlexAttention backward): GQA, sliding windows (mistral, gemma2's local layers)
    and Gemma 2's soft cap through the one call."""
    model, _ = build_tiny_model(arch, seed=1, tokenizer=tiny_tokenizer)
    input_ids, attention_mask, position_ids = grpo_like_rows(model.config.vocab_size)
    valid = attention_mask[:, PROMPT_COLS:].bool()
    with torch.no_grad():
        for layer in model.model.layers:  # scores well past Gemma 2's cap of 0.5, so the cap changes them
            layer.self_attn.q_proj.weight.mul_(8.0)
            layer.self_attn.k_proj.weight.mul_(8.0)
        padded, _ = compute_log_probs(model, input_ids=input_ids, attention_mask=attention_mask,
                                      position_ids=position_ids, response_length=RESPONSE_COLS, temperature=0.7)
        monkeypatch.setattr(segment_attention, "FLEX_SEGMENT_DEVICES", ("cpu",))
        packed = PackedResponses(input_ids, attention_mask, response_length=RESPONSE_COLS, share_prompt=share_prompt)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # eager FlexAttention says it is a slow reference
            log_probs, _ = packed_log_probs(model, packed, temperature=0.7)
    torch.testing.assert_close(log_probs[valid], padded[valid], rtol=0, atol=2e-5)


def test_flex_runs_and_its_block_mask_is_shared_by_the_layers(tiny_tokenizer, monkeypatch):
    """The flex path is the one taken (a broken rule changes the log-probs), and one block mask per window serves
    every layer of a forward."""
    from hybridflow.models import flex_segments

    model, _ = build_tiny_model("qwen2", seed=1, tokenizer=tiny_tokenizer)
    input_ids, attention_mask, _ = grpo_like_rows(model.config.vocab_size)
    packed = PackedResponses(input_ids, attention_mask, response_length=RESPONSE_COLS, share_prompt=True)
    monkeypatch.setattr(segment_attention, "FLEX_SEGMENT_DEVICES", ("cpu",))
    calls = []
    real = flex_segments.RowRoles.of.__func__

    def counted(cls, *args, **kwargs):
        calls.append(1)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(flex_segments.RowRoles, "of", classmethod(counted))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        packed_log_probs(model, packed, temperature=0.7)
    assert len(calls) == 1 < model.config.num_hidden_layers


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch", ["qwen2", "gemma2"])
def test_flex_log_probs_and_gradients_equal_padded_on_cuda(tiny_tokenizer, monkeypatch, arch):
    """Issue 47: the compiled FlexAttention forward and backward of a shared-prompt row give the padded forward's
    log-probs and gradients (fp32)."""
    model, _ = build_tiny_model(arch, seed=1, tokenizer=tiny_tokenizer)
    model = model.cuda().train()
    input_ids, attention_mask, position_ids = (t.cuda() for t in grpo_like_rows(model.config.vocab_size))
    valid = attention_mask[:, PROMPT_COLS:].bool()
    weights = torch.randn(valid.shape, generator=torch.Generator().manual_seed(3)).cuda()
    padded, _ = compute_log_probs(model, input_ids=input_ids, attention_mask=attention_mask,
                                  position_ids=position_ids, response_length=RESPONSE_COLS, temperature=0.7)
    (padded * weights * valid).sum().backward()
    expected = grads(model)
    monkeypatch.setattr(segment_attention, "FLEX_SEGMENT_DEVICES", ("cuda",))
    packed = PackedResponses(input_ids, attention_mask, response_length=RESPONSE_COLS, share_prompt=True)
    log_probs, _ = packed_log_probs(model, packed, temperature=0.7)
    (log_probs * weights * valid).sum().backward()
    torch.testing.assert_close(log_probs[valid], padded[valid], rtol=0, atol=1e-4)
    got = grads(model)
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-3, atol=1e-4, msg=name)

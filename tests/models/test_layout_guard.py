"""The layout guard (issue 58): a model whose packed forward differs from its padded one is caught before training
with one line naming the attention feature, and falls back to a layout that agrees; gpt-oss's attention sinks are
honoured by every packed path, so it keeps the default layout."""

import logging

import pytest
import torch

from hybridflow.data.packing import PackedResponses
from hybridflow.models import ValueModel, build_tiny_model, compute_log_probs, packed_log_probs
from hybridflow.models.layout_guard import checked_layout, probe_layouts
from hybridflow.models.segment_attention import capped_attention, use_segment_attention
from hybridflow.trainer.sft.layout_check import sft_packing_agrees
from tests.models.non_native import build_non_native
from tests.models.test_segment_attention import PROMPT_COLS, RESPONSE_COLS, grads, grpo_like_rows

TEMPERED = "test_tempered_heads"


def _tempered_attention(module, query, key, value, attention_mask, scaling=None, head_temperature=None, **kwargs):
    """SDPA with each head's scores multiplied by ``head_temperature [H]``: a feature segment attention does not
    know (it receives the kwarg and drops it)."""
    q = query * head_temperature.reshape(1, -1, 1, 1)
    out = capped_attention(q, key, value, mask=attention_mask, scale=scaling, softcap=None, grouped=True)
    return out.transpose(1, 2).contiguous(), None


def tempered_llama(tiny_tokenizer):
    """A tiny Llama whose attention passes a per-head ``head_temperature`` to its attention implementation."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(TEMPERED, _tempered_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(TEMPERED, sdpa_mask)
    model, _ = build_tiny_model("llama", seed=1, tokenizer=tiny_tokenizer)
    for layer in model.model.layers:
        attention = layer.self_attn
        attention.head_temperature = torch.nn.Parameter(torch.linspace(0.5, 3.0, model.config.num_attention_heads))
        forward = attention.forward
        attention.forward = lambda *args, _f=forward, _a=attention, **kw: _f(
            *args, head_temperature=_a.head_temperature, **kw)
    model.config._attn_implementation = TEMPERED
    return model


def test_a_model_whose_attention_feature_the_packed_path_ignores_is_caught_with_one_line(tiny_tokenizer, caplog):
    model = tempered_llama(tiny_tokenizer)
    with caplog.at_level(logging.WARNING):
        assert checked_layout(model, "shared_prompt", key="actor_rollout_ref.model") == "padded"
    lines = [r.getMessage() for r in caplog.records if r.name == "hybridflow.models.layout_guard"]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert lines[0].startswith("actor_rollout_ref.model: LlamaForCausalLM's shared_prompt layout differs from its "
                               "padded forward by ")
    assert "LlamaAttention passes head_temperature" in lines[0] and lines[0].endswith("the padded layout runs")
    assert model.config._attn_implementation == TEMPERED  # the padded layout runs the model's own attention


def test_the_critic_value_model_is_guarded_through_its_backbone(tiny_tokenizer, caplog):
    model = ValueModel(tempered_llama(tiny_tokenizer).model)
    with caplog.at_level(logging.WARNING):
        assert checked_layout(model, "packed", key="critic.model") == "padded"
    assert "critic.model: ValueModel's packed layout differs" in caplog.text
    plain = ValueModel(build_tiny_model("llama", seed=1, tokenizer=tiny_tokenizer)[0].model)
    assert checked_layout(plain, "shared_prompt", key="critic.model") == "shared_prompt"


def test_sft_packing_of_a_model_that_differs_falls_back_with_one_line(tiny_tokenizer, caplog):
    model = tempered_llama(tiny_tokenizer)
    with caplog.at_level(logging.WARNING):
        assert not sft_packing_agrees(model, pad_token_id=tiny_tokenizer.pad_token_id)
    assert "data.use_packing: LlamaForCausalLM's packed layout differs" in caplog.text
    assert "the padded layout runs" in caplog.text


@pytest.mark.parametrize("arch", ["olmo2", "gpt_oss", "glm4_moe", "deepseek_v3"])
def test_non_native_architectures_keep_the_default_layout(tiny_tokenizer, arch, caplog):
    """olmo2 is the control; gpt-oss's sinks and alternating sliding windows are honoured by segment attention."""
    model, _ = build_non_native(arch, tokenizer=tiny_tokenizer)
    with caplog.at_level(logging.WARNING):
        verdict = probe_layouts(model, ("shared_prompt", "packed", "padded"))
        assert sft_packing_agrees(model, pad_token_id=tiny_tokenizer.pad_token_id)
    assert verdict.chosen == "shared_prompt" and verdict.differences["shared_prompt"] <= 2e-6
    assert "differs" not in caplog.text


@pytest.mark.parametrize("flex", [False, True])
def test_gpt_oss_packed_log_probs_and_gradients_equal_padded(tiny_tokenizer, monkeypatch, flex):
    """Sinks drawn with std 1 (HF's 0.02 hides a path that drops them) and a window of 8 on layer 0: every packed
    path equals the model's own eager attention; gradients reach the sinks alike (per-unit path: FlexAttention has
    no CPU backward)."""
    from hybridflow.models import segment_attention

    model, _ = build_non_native("gpt_oss", seed=1, tokenizer=tiny_tokenizer)
    if flex:
        monkeypatch.setattr(segment_attention, "FLEX_SEGMENT_DEVICES", ("cpu",))
    input_ids, attention_mask, position_ids = grpo_like_rows(model.config.vocab_size)
    valid = attention_mask[:, PROMPT_COLS:].bool()
    assert model.config._attn_implementation == "eager"
    padded = compute_log_probs(model, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               response_length=RESPONSE_COLS)[0]
    if not flex:
        (padded * valid).sum().backward()
    expected = grads(model)
    for share_prompt in (False, True):
        packed = PackedResponses(input_ids, attention_mask, response_length=RESPONSE_COLS, share_prompt=share_prompt)
        with torch.set_grad_enabled(not flex):
            log_probs = packed_log_probs(model, packed)[0]
        torch.testing.assert_close(log_probs[valid], padded[valid].detach(), rtol=0, atol=2e-6)
        if not flex:
            (log_probs * valid).sum().backward()
            got = grads(model)
            assert any("sinks" in name for name in got)
            for name in expected:
                torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=2e-6, msg=name)


def test_gpt_oss_padded_forward_under_segment_attention_keeps_its_sinks(tiny_tokenizer):
    """Once switched to segment attention (no layout: the padded path), the sinks still join every softmax."""
    model, _ = build_non_native("gpt_oss", seed=1, tokenizer=tiny_tokenizer)
    input_ids, attention_mask, position_ids = grpo_like_rows(model.config.vocab_size)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    with torch.no_grad():
        own = model(**inputs).logits
        use_segment_attention(model)
        switched = model(**inputs).logits
    valid = attention_mask.bool()
    torch.testing.assert_close(switched[valid], own[valid], rtol=0, atol=2e-5)


def test_ulysses_gives_each_rank_the_sinks_of_its_own_heads(monkeypatch):
    """Under sequence parallelism a rank attends with heads/S heads: its sinks are those heads' (the exchange
    is replaced by rank 1's share of the heads; the real all-to-all is tests/workers/test_sequence_parallel.py's)."""
    from hybridflow.models import ulysses

    def exchange(tensor, _sp, forward, _inverse):
        return tensor[:, tensor.shape[1] // 2:] if forward is ulysses._seq_to_heads else tensor

    monkeypatch.setattr(ulysses._Exchange, "apply", exchange)
    seen = {}

    def inner(_module, query, _key, _value, _mask, **kwargs):
        seen.update(kwargs)
        return query.transpose(1, 2), None

    qkv = [torch.zeros(1, 4, 3, 2) for _ in range(3)]
    ulysses.SequenceParallel(size=2, rank=1).attention(inner, None, *qkv, None, s_aux=torch.arange(4.0))
    assert seen["s_aux"].tolist() == [2.0, 3.0]

"""The repetition penalty (vLLM's and HF's rule, Keskar et al. 2019): hand-computed logits, HF generate's tokens,
per-row values in one batch, and the config key that reaches it."""

import math

import pytest
import torch

from hybridflow.errors import RolloutError
from hybridflow.rollout import SamplingParams, sampling_params_from_rollout_config
from hybridflow.rollout.native import NativeEngine
from hybridflow.rollout.sampler import RowSampling, apply_repetition_penalty, sample_tokens, seen_mask
from tests.rollout.conftest import chat_prompts
from tests.rollout.test_config import rollout_cfg
from tests.rollout.test_paged_engine import tight_blocks


def test_seen_tokens_are_divided_where_positive_and_multiplied_where_not():
    """Row 0 (r = 2) has seen tokens 0 and 1 (1 twice: penalised once): 2 -> 1, -1 -> -2; token 2 and 3 unseen
    keep 0.5 and 3. Row 1 (r = 1) is unchanged; the input is not written."""
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0], [1.0, 1.0, 1.0, 1.0]])
    seen = seen_mask([[0, 1, 1], [0, 2]], vocab_size=4, device="cpu")
    assert seen.tolist() == [[True, True, False, False], [True, False, True, False]]
    out = apply_repetition_penalty(logits=logits, penalty=torch.tensor([2.0, 1.0]), seen=seen)
    assert out.tolist() == [[1.0, -2.0, 0.5, 3.0], [1.0, 1.0, 1.0, 1.0]]
    assert logits[0].tolist() == [2.0, -1.0, 0.5, 3.0]


def test_a_greedy_row_picks_the_best_token_after_the_penalty():
    """z = (3, 2.5), token 0 seen, r = 2: 3 / 2 = 1.5 < 2.5, so token 1, with log softmax(1.5, 2.5)[1]."""
    rows = RowSampling.of([SamplingParams(temperature=0, repetition_penalty=2.0)], vocab_size=2, device="cpu")
    tokens, logprobs = sample_tokens(logits=torch.tensor([[3.0, 2.5]]), params=rows,
                                     seen=seen_mask([[0]], vocab_size=2, device="cpu"))
    assert tokens.tolist() == [1]
    assert logprobs.item() == pytest.approx(2.5 - math.log(math.exp(1.5) + math.exp(2.5)), abs=1e-6)


def test_a_penalty_without_the_rows_tokens_is_an_error():
    rows = RowSampling.of([SamplingParams(repetition_penalty=1.2)], vocab_size=2, device="cpu")
    with pytest.raises(ValueError, match="seen"):
        sample_tokens(logits=torch.zeros(1, 2), params=rows, uniform=torch.rand(1, 1))


def test_a_penalty_must_be_positive():
    with pytest.raises(RolloutError, match="repetition_penalty"):
        SamplingParams(repetition_penalty=0.0)


@pytest.mark.parametrize("schedule", ["one batch", "lanes", "preempted"])
def test_greedy_with_a_penalty_is_hf_generate_token_for_token(tiny_llama, schedule):
    """Every row penalised by its own prompt and response (HF's processor reads the same ids), through the
    native engine's admission wave and decode steps: one batch, two lanes, or a pool so small that sequences are
    preempted and resume (their seen tokens then rebuilt from the prompt and the tokens so far)."""
    model, tokenizer = tiny_llama
    prompts, eos = chat_prompts(tokenizer), tokenizer.eos_token_id
    blocks = tight_blocks(prompts, 24) if schedule == "preempted" else None
    engine = NativeEngine(model, tokenizer, decode_lanes=schedule == "lanes", num_kv_blocks=blocks)
    params = SamplingParams(n=1, temperature=0, max_tokens=24, stop_token_ids=[eos], repetition_penalty=3.0)
    completions = engine.generate(prompts, params)
    assert (engine.preemptions > 0) == (schedule == "preempted")
    for completion, prompt in zip(completions, prompts):
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             do_sample=False, max_new_tokens=24, eos_token_id=eos, pad_token_id=eos,
                             repetition_penalty=3.0)
        reference = out[0, len(prompt):].tolist()
        reference = reference[: reference.index(eos) + 1] if eos in reference else reference
        assert completion.token_ids == reference
    plain = engine.generate(prompts[:1], SamplingParams(n=1, temperature=0, max_tokens=24, stop_token_ids=[eos]))
    assert plain[0].token_ids != completions[0].token_ids  # the penalty changed what was generated


def test_rows_with_and_without_a_penalty_share_a_batch(tiny_llama):
    model, tokenizer = tiny_llama
    prompts, eos = chat_prompts(tokenizer)[:2], tokenizer.eos_token_id
    engine = NativeEngine(model, tokenizer)
    each = [SamplingParams(n=1, temperature=0, max_tokens=16, stop_token_ids=[eos], repetition_penalty=r)
            for r in (1.0, 3.0)]
    mixed = engine.generate(prompts, each)
    alone = [engine.generate([prompt], params)[0] for prompt, params in zip(prompts, each)]
    assert [c.token_ids for c in mixed] == [c.token_ids for c in alone]


def test_the_rollout_key_reaches_training_and_validation_params():
    cfg = rollout_cfg(repetition_penalty=1.3)
    assert sampling_params_from_rollout_config(cfg, eos_token_id=2).repetition_penalty == 1.3
    assert sampling_params_from_rollout_config(cfg, validate=True, eos_token_id=2).repetition_penalty == 1.3
    assert sampling_params_from_rollout_config(rollout_cfg(), eos_token_id=2).repetition_penalty == 1.0


def test_the_hf_engine_applies_the_same_penalty(tiny_llama):
    from hybridflow.rollout import build_engine

    model, tokenizer = tiny_llama
    prompts, eos = chat_prompts(tokenizer)[:2], tokenizer.eos_token_id
    params = SamplingParams(n=1, temperature=0, max_tokens=16, stop_token_ids=[eos], repetition_penalty=3.0)
    native = NativeEngine(model, tokenizer).generate(prompts, params)
    hf = build_engine("hf", model, tokenizer).generate(prompts, params)
    assert [c.token_ids for c in hf] == [c.token_ids for c in native]

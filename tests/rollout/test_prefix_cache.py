"""Prefix reuse in the native engine: a prompt that extends a finished sequence prefills only the new tokens."""

import torch

from hybridflow.rollout import SamplingParams
from hybridflow.rollout.native import NativeEngine
from hybridflow.rollout.prefix_cache import PrefixCache
from tests.rollout.conftest import chat_prompts


def test_prefill_after_a_computed_prefix_equals_the_full_prefill(tiny):
    model, tokenizer = tiny
    engine = NativeEngine(model, tokenizer)
    ids = torch.tensor(chat_prompts(tokenizer)[2])
    (full_logits, full_kv), = engine.decoder.prefill_many([ids])
    (_, head_kv), = engine.decoder.prefill_many([ids[:7]])
    (logits, kv), = engine.decoder.prefill_many([ids[7:]], computed=[head_kv])
    torch.testing.assert_close(logits, full_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kv, full_kv, atol=1e-5, rtol=1e-5)


def second_turn_prompts(engine, tokenizer):
    prompts = chat_prompts(tokenizer)
    params = SamplingParams(n=1, temperature=0.0, max_tokens=6, stop_token_ids=[tokenizer.eos_token_id])
    first = engine.generate(prompts, params)
    observation = tokenizer("\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    return [p + c.token_ids + observation["input_ids"] for p, c in zip(prompts, first)], first, params


def test_second_turn_reuses_the_first_and_generates_the_same(tiny):
    model, tokenizer = tiny
    cached, plain = NativeEngine(model, tokenizer, prefix_cache_tokens=4096), NativeEngine(model, tokenizer)
    prompts, first, params = second_turn_prompts(cached, tokenizer)
    reused = sum(len(p) + len(c.token_ids) - 1 for p, c in zip(chat_prompts(tokenizer), first))
    with_cache, without = cached.generate(prompts, params), plain.generate(prompts, params)
    assert [c.token_ids for c in with_cache] == [c.token_ids for c in without]
    for a, b in zip(with_cache, without):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=1e-4)
    assert cached.prefix_cache.hits == len(prompts) and cached.prefix_cache.reused_tokens == reused


def test_new_weights_drop_the_cache(tiny):
    model, tokenizer = tiny
    engine = NativeEngine(model, tokenizer, prefix_cache_tokens=4096)
    second_turn_prompts(engine, tokenizer)
    assert engine.prefix_cache.entries
    engine.load_weights(list(model.state_dict().items()))
    assert not engine.prefix_cache.entries and engine.prefix_cache.tokens == 0


def test_lookup_takes_the_longest_proper_prefix_and_eviction_keeps_the_budget():
    cache = PrefixCache(max_tokens=6)
    cache.store([1, 2], torch.zeros(1))
    cache.store([1, 2, 3], torch.ones(1))
    assert cache.longest_prefix([1, 2, 3, 4])[0] == 3
    assert cache.longest_prefix([1, 2, 3])[0] == 2  # a proper prefix: one token must be left to compute
    assert cache.longest_prefix([9, 1, 2])[0] == 0
    cache.store([5, 6, 7], torch.ones(1))  # 2 + 3 + 3 tokens > 6: the least recently used, (1, 2, 3), goes
    assert set(cache.entries) == {(1, 2), (5, 6, 7)} and cache.tokens == 5

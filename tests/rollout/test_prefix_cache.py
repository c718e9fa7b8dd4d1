"""Prefix reuse in the native engine: a prompt that extends a finished sequence takes its named blocks and
prefills only the rest."""

import torch

from hybridflow.rollout import SamplingParams
from hybridflow.rollout.native import NativeEngine
from hybridflow.rollout.block_manager import BLOCK_SIZE
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
    # The cache holds each first-turn prompt and all its tokens but the last (never fed back): its whole blocks.
    held = [len(p) + len(c.token_ids) - 1 for p, c in zip(chat_prompts(tokenizer), first)]
    reused = [length // BLOCK_SIZE * BLOCK_SIZE for length in held]
    assert sum(reused) > 0
    with_cache, without = cached.generate(prompts, params), plain.generate(prompts, params)
    assert [c.token_ids for c in with_cache] == [c.token_ids for c in without]
    for a, b in zip(with_cache, without):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=1e-4)
    assert cached.allocator.hits == sum(1 for r in reused if r) and cached.allocator.reused_tokens == sum(reused)
    assert plain.allocator.hits == 0


def test_new_weights_drop_the_cache(tiny):
    model, tokenizer = tiny
    engine = NativeEngine(model, tokenizer, prefix_cache_tokens=4096)
    second_turn_prompts(engine, tokenizer)
    assert engine.allocator.block_of and engine.allocator.evictable
    engine.load_weights(list(model.state_dict().items()))
    assert not engine.allocator.block_of and not engine.allocator.evictable
    assert engine.allocator.available == engine.allocator.num_blocks - 1  # every block free again

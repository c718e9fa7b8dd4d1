"""A rollout batch does not depend on what the engine ran before it (with the same weights): a killed and resumed
run, whose engine starts empty, then reproduces the uninterrupted one bit for bit.

The uninterrupted run's validation rollout leaves the prompts' blocks named in the prefix cache, and the next
step's training rollout (same weights) would prefill from them: the few tokens past the cached blocks go through
the matmuls as a short chunk, whose sums run in another order than the whole prompt's (~5e-7 in the log-probs).
"""

from __future__ import annotations

import dataclasses

import torch

from hybridflow.data.batch import Batch
from hybridflow.data.padding import pad_sequences, position_ids_from_mask
from hybridflow.rollout import SamplingParams
from hybridflow.rollout.block_manager import BLOCK_SIZE
from hybridflow.rollout.native import NativeEngine
from hybridflow.workers.rollout import RolloutWorker


def prompts_past_whole_blocks(tokenizer) -> Batch:
    """Prompts 1 to 3 tokens past a whole number of blocks: a prefix-cache hit leaves a chunk of 1-3 rows, the
    row counts where the CPU matmul takes a path of its own."""
    generator = torch.Generator().manual_seed(1)
    ids = [torch.randint(10, 500, (BLOCK_SIZE * blocks + extra,), generator=generator).tolist()
           for blocks in (1, 2) for extra in (1, 2, 3)]
    input_ids = pad_sequences(ids, pad_value=tokenizer.pad_token_id, side="left")
    mask = pad_sequences([[1] * len(x) for x in ids], pad_value=0, side="left")
    batch = Batch({"input_ids": input_ids, "attention_mask": mask, "position_ids": position_ids_from_mask(mask)})
    batch["raw_prompt_ids"] = ids
    return batch


def test_a_batch_is_bitwise_the_same_after_another_with_the_same_weights(tiny_llama, tiny_tokenizer):
    model = tiny_llama[0]
    params = SamplingParams(n=2, temperature=1.0, max_tokens=8, seed=5, logprobs=True)

    def fresh_worker() -> RolloutWorker:
        engine = NativeEngine(model, tiny_tokenizer, decode_lanes=False, prefix_cache_tokens=4096)
        return RolloutWorker(engine=engine, pad_token_id=tiny_tokenizer.pad_token_id)

    resumed = fresh_worker().generate(prompts_past_whole_blocks(tiny_tokenizer), params)
    straight = fresh_worker()
    straight.generate(prompts_past_whole_blocks(tiny_tokenizer), dataclasses.replace(params, temperature=0.0))  # "validation"
    after_validation = straight.generate(prompts_past_whole_blocks(tiny_tokenizer), params)
    assert torch.equal(after_validation["responses"], resumed["responses"])
    assert torch.equal(after_validation["rollout_log_probs"], resumed["rollout_log_probs"])


def test_the_prefix_cache_still_serves_the_turns_of_one_batch(tiny_llama, tiny_tokenizer):
    """Reset per batch, not off: a prompt reuses the blocks an earlier call named until the cache is reset."""
    model = tiny_llama[0]
    engine = NativeEngine(model, tiny_tokenizer, decode_lanes=False, prefix_cache_tokens=4096)
    prompt = list(range(10, 10 + 2 * BLOCK_SIZE + 3))
    engine.generate([prompt], SamplingParams(max_tokens=2, temperature=0.0))
    engine.generate([prompt], SamplingParams(max_tokens=2, temperature=0.0))
    assert engine.allocator.hits == 1
    engine.reset_prefix_cache()
    engine.generate([prompt], SamplingParams(max_tokens=2, temperature=0.0))
    assert engine.allocator.hits == 1

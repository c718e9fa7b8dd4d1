"""``RolloutWorker.generate_partial``: a weight sync between two decode steps pauses the in-flight
sequences and continues them from their exact next token (verl's partial rollout)."""

from __future__ import annotations

import pytest
import torch

from hybridflow.data.batch import Batch
from hybridflow.data.padding import pad_sequences, position_ids_from_mask
from hybridflow.rollout import SamplingParams
from hybridflow.rollout.native import NativeEngine
from hybridflow.workers.rollout import RolloutWorker
from tests.rollout.conftest import chat_prompts
from tests.rollout.test_streaming import varied_model


class ScriptedHandover:
    """Asks for the engine after ``after`` decode steps; while it holds it, loads ``weights`` (the trainer's sync)."""

    def __init__(self, engine, weights, *, after: int):
        self.engine, self.weights, self.after = engine, weights, after
        self.version, self.checks, self.handed_over = 0, 0, 0

    def requested(self) -> bool:
        self.checks += 1
        return self.checks == self.after

    def wait(self) -> int:
        self.engine.load_weights(self.weights)
        self.version += 1
        self.handed_over += 1
        return self.version


def _prompts(tokenizer) -> Batch:
    ids = chat_prompts(tokenizer)
    input_ids = pad_sequences(ids, pad_value=tokenizer.pad_token_id, side="left")
    mask = pad_sequences([[1] * len(x) for x in ids], pad_value=0, side="left")
    batch = Batch({"input_ids": input_ids, "attention_mask": mask, "position_ids": position_ids_from_mask(mask)})
    batch["raw_prompt_ids"] = ids
    return batch


@pytest.mark.parametrize("n", [1, 2])
def test_a_sync_with_the_same_weights_changes_no_token(tiny_tokenizer, n):
    model, tokenizer = varied_model(tiny_tokenizer, seed=1)
    params = SamplingParams(n=n, temperature=0, max_tokens=12, stop_token_ids=[tokenizer.eos_token_id], logprobs=True)
    worker = RolloutWorker(engine=NativeEngine(model, tokenizer, decode_lanes=False), pad_token_id=tokenizer.pad_token_id)
    plain = worker.generate(_prompts(tokenizer), params)
    handover = ScriptedHandover(worker.engine, list(model.named_parameters()), after=4)
    partial = worker.generate_partial(_prompts(tokenizer), params, handover=handover)
    assert handover.handed_over == 1
    assert torch.equal(partial["responses"], plain["responses"])
    assert torch.equal(partial["response_mask"], plain["response_mask"])
    torch.testing.assert_close(partial["rollout_log_probs"], plain["rollout_log_probs"], atol=1e-4, rtol=0)
    # the first 4 steps (5 tokens) ran with version 0; the responses still decoding then ended with version 1
    spans = partial["rollout_first_version"] != partial["rollout_last_version"]
    assert spans.any() and torch.equal(partial["rollout_first_version"], torch.zeros(len(partial), dtype=torch.long))
    assert torch.equal(partial["rollout_last_version"][spans], torch.ones(int(spans.sum()), dtype=torch.long))


def test_tokens_after_the_sync_come_from_the_new_weights(tiny_tokenizer):
    model, tokenizer = varied_model(tiny_tokenizer, seed=1)
    other = varied_model(tiny_tokenizer, seed=7)[0]
    params = SamplingParams(temperature=0, max_tokens=12, logprobs=True)
    worker = RolloutWorker(engine=NativeEngine(model, tokenizer, decode_lanes=False), pad_token_id=tokenizer.pad_token_id)
    prompts = _prompts(tokenizer)
    partial = worker.generate_partial(prompts, params, handover=ScriptedHandover(worker.engine, list(other.named_parameters()),
                                                                                 after=2))
    fresh = NativeEngine(other, tokenizer, decode_lanes=False)
    for row, prompt in enumerate(prompts["raw_prompt_ids"]):
        tokens = partial["responses"][row][partial["response_mask"][row].bool()].tolist()
        head = tokens[:3]  # the first 2 steps: prefill token + 1 decode, all with the old weights
        tail = fresh.generate([list(prompt) + head], SamplingParams(temperature=0, max_tokens=12 - 3))[0].token_ids
        assert tokens == head + tail

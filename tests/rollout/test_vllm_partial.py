"""verl's partial rollout on a real vLLM (``make test-vllm``): a weight sync that lands mid-generation aborts vLLM's
requests and resubmits each as its prompt plus its tokens so far, so the continued tokens come from the new weights.

Checked against an fp32 HF forward of the tiny Llama: each token's vLLM log-prob equals the log-prob of the weights
of the version it is tagged with, within 1e-4 (vLLM's CPU fp32 kernels; ~1e-6 seen), and differs by far more from
the other version's (so a continuation that kept the old weights, or a prefix prefilled with them, fails here).
"""

import pytest
import torch

from hybridflow.rollout import SamplingParams
from hybridflow.rollout.engine import partial_session
from tests.rollout.test_vllm_real import LOGPROB_TOL, engine, prompts, saved, wide_tiny_model  # noqa: F401

pytestmark = pytest.mark.vllm


def sampled(tokenizer) -> SamplingParams:
    return SamplingParams(n=2, temperature=1.0, max_tokens=12, logprobs=True, seed=7,
                          stop_token_ids=[tokenizer.eos_token_id])


def run_session(engine, tokenizer, *, pause_after: int | None = None, new_weights=None):
    """Submit the prompts, step; after ``pause_after`` steps pause, load ``new_weights`` (version 1), resume."""
    session = partial_session(engine, sampled(tokenizer), max_prompt_length=64)
    for index, ids in enumerate(prompts(tokenizer)):
        session.submit(index, ids)
    done, steps, paused = [], 0, []
    while not session.idle:
        done += session.step()
        steps += 1
        if steps == pause_after:
            paused = session.pause()
            engine.load_weights(new_weights.state_dict().items())
            session.weights_reloaded(version=1)
            session.resume(paused)
    session.close()
    return sorted(done, key=lambda c: (c.request_id, c.output_index)), paused


def hf_logprobs(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model.float()(ids).logits[0, len(prompt) - 1: -1]
    return logits.log_softmax(-1).gather(-1, torch.tensor(tokens).unsqueeze(-1)).squeeze(-1)


def test_partial_session_without_a_sync_samples_what_generate_does(saved, engine):
    """Each sample is its own n=1 request seeded as vLLM seeds generate's n children: the same tokens and log-probs."""
    _, _, tokenizer = saved
    want = engine.generate(prompts(tokenizer), sampled(tokenizer))
    got, _ = run_session(engine, tokenizer)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    assert [c.logprobs for c in got] == [c.logprobs for c in want]
    assert all(c.weight_versions == [0] * len(c.token_ids) for c in got)


def test_a_sync_mid_generation_continues_each_sequence_with_the_new_weights(saved, engine):
    _, model, tokenizer = saved
    trained, _ = wide_tiny_model(seed=1)
    try:
        done, paused = run_session(engine, tokenizer, pause_after=4, new_weights=trained)
    finally:
        engine.load_weights(model.state_dict().items())  # the module's engine back to the saved weights
    assert paused and all(item.token_ids for item in paused), "the sync landed before any token or after all"
    mixed = [c for c in done if c.weight_versions[0] == 0 and c.weight_versions[-1] == 1]
    assert mixed, [c.weight_versions for c in done]
    by_version = {0: model, 1: trained}
    for c in done:
        prompt = prompts(tokenizer)[c.request_id]
        assert c.weight_versions == sorted(c.weight_versions)  # a version-0 prefix, then version 1
        got = torch.tensor(c.logprobs)
        for version, weights in by_version.items():
            mine = torch.tensor(c.weight_versions) == version
            if mine.any():
                gap = (got - hf_logprobs(weights, prompt, c.token_ids)).abs()
                assert gap[mine].max() < LOGPROB_TOL, (version, gap)
                other = hf_logprobs(by_version[1 - version], prompt, c.token_ids)
                assert (got - other).abs()[mine].max() > 100 * LOGPROB_TOL  # the two versions are told apart

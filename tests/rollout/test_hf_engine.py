"""The HF reference backend: grouping, stop trimming, log-probs."""

import torch

from hybridflow.rollout import SamplingParams, build_engine
from tests.rollout.conftest import chat_prompts


def test_hf_engine_groups_samples_trims_after_stop_and_reports_processed_logprobs(tiny_llama):
    model, tokenizer = tiny_llama
    prompts = chat_prompts(tokenizer)[:2]
    stop = list(range(3, 60))
    params = SamplingParams(n=3, temperature=0.8, max_tokens=12, stop_token_ids=stop, seed=0)
    completions = build_engine("hf", model, tokenizer).generate(prompts, params)
    assert [c.prompt_index for c in completions] == [0, 0, 0, 1, 1, 1]
    for c in completions:
        assert all(t not in stop for t in c.token_ids[:-1])
        assert (c.finish_reason == "stop") == (c.token_ids[-1] in stop)
        ids = torch.tensor([prompts[c.prompt_index] + c.token_ids])
        with torch.no_grad():
            z = model(input_ids=ids).logits[0, len(prompts[c.prompt_index]) - 1 : -1] / 0.8
        expected = z.log_softmax(-1).gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-4)


def test_hf_engine_greedy_n_copies_and_native_agree(tiny_llama):
    model, tokenizer = tiny_llama
    prompts = chat_prompts(tokenizer)
    params = SamplingParams(n=2, temperature=0, max_tokens=10, stop_token_ids=[tokenizer.eos_token_id])
    hf = build_engine("hf", model, tokenizer).generate(prompts, params)
    native = build_engine("native", model, tokenizer).generate(prompts, params)
    assert [c.token_ids for c in hf] == [c.token_ids for c in native]
    assert hf[0].token_ids == hf[1].token_ids


def test_hf_engine_ignore_eos_runs_past_the_models_own_eos(tiny_llama):
    """``ignore_eos`` must not fall back to ``model.generation_config.eos_token_id`` (HF fills a None from it):
    the run stops only at ``max_tokens``, as the native engine's does."""
    model, tokenizer = tiny_llama
    prompt = chat_prompts(tokenizer)[:1]
    engine = build_engine("hf", model, tokenizer)
    first = engine.generate(prompt, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))[0].token_ids[0]
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = first  # the model's own EOS is its first greedy token
    try:
        (completion,) = engine.generate(prompt, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    finally:
        model.generation_config.eos_token_id = saved
    assert len(completion.token_ids) == 5 and completion.finish_reason == "length"

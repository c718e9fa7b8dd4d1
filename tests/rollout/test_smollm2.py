"""Greedy parity and log-prob agreement on the real default model (slow: needs the fetched SmolLM2)."""

import pytest
import torch

from hybridflow.rollout import SamplingParams, build_engine
from tests.rollout.conftest import chat_prompts

pytestmark = pytest.mark.slow

QUESTIONS = ["What is 3 + 4? Reply with only the final answer.", "Compute 12 * 7.",
             "What is the capital of France?", "Solve 5 - 9 step by step."]


@pytest.fixture(scope="module")
def smollm2():
    from hybridflow.models import fetch_default_model, load_causal_lm, load_tokenizer

    path = fetch_default_model()
    return load_causal_lm(path).eval(), load_tokenizer(path)


def test_native_greedy_equals_hf_generate_on_smollm2(smollm2):
    model, tokenizer = smollm2
    prompts = chat_prompts(tokenizer, QUESTIONS)
    params = SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[tokenizer.eos_token_id])
    native = build_engine("native", model, tokenizer).generate(prompts, params)
    for prompt, completion in zip(prompts, native):
        out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=40,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        assert completion.token_ids == out[0, len(prompt):].tolist()


def test_native_sampled_logprobs_equal_teacher_forcing_on_smollm2(smollm2):
    model, tokenizer = smollm2
    prompts = chat_prompts(tokenizer, QUESTIONS[:2])
    params = SamplingParams(n=2, temperature=1.0, max_tokens=32, stop_token_ids=[tokenizer.eos_token_id], seed=0)
    for c in build_engine("native", model, tokenizer).generate(prompts, params):
        prompt = prompts[c.prompt_index]
        with torch.no_grad():
            z = model(input_ids=torch.tensor([prompt + c.token_ids])).logits[0, len(prompt) - 1 : -1]
        expected = z.log_softmax(-1).gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-4)

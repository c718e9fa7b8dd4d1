"""Tiny models and chat prompts shared by the rollout tests."""

import pytest

from hybridflow.models.tiny import build_tiny_model

QUESTIONS = ["what is 2 + 3", "the answer is", "solve 7 * 8 step by step", "hi"]


def chat_prompts(tokenizer, questions=QUESTIONS) -> list[list[int]]:
    return [
        list(tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                           return_dict=True)["input_ids"])
        for q in questions
    ]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny(request, tiny_tokenizer):
    """``(model, tokenizer)`` of each supported architecture."""
    return build_tiny_model(request.param, seed=1, tokenizer=tiny_tokenizer)


@pytest.fixture(scope="module")
def tiny_llama(tiny_tokenizer):
    return build_tiny_model("llama", seed=1, tokenizer=tiny_tokenizer)

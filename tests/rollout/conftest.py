"""Tiny models and chat prompts shared by the rollout tests."""

import pytest

from hybridflow.models.tiny import TINY_ARCHITECTURES, build_tiny_model

QUESTIONS = ["what is 2 + 3", "the answer is", "solve 7 * 8 step by step", "hi"]


def chat_prompts(tokenizer, questions=QUESTIONS) -> list[list[int]]:
    return [
        list(tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                           return_dict=True)["input_ids"])
        for q in questions
    ]


@pytest.fixture(scope="module", params=TINY_ARCHITECTURES)
def tiny(request, tiny_tokenizer):
    """``(model, tokenizer)`` of each supported architecture."""
    model, tokenizer = build_tiny_model(request.param, seed=1, tokenizer=tiny_tokenizer)
    return randomise_norms(model), tokenizer


def randomise_norms(model, seed: int = 0):
    """Every RMSNorm weight starts at 1 (0 in Gemma, which scales by 1 + w); distinct random values catch a
    swapped, skipped or mis-offset norm (Qwen3's and Gemma 3's q / k norms, Gemma's four norms a layer)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if name.endswith("norm.weight"):
                weight.copy_(0.5 + torch.rand(weight.shape, generator=generator))
    return model


@pytest.fixture(scope="module")
def tiny_llama(tiny_tokenizer):
    return build_tiny_model("llama", seed=1, tokenizer=tiny_tokenizer)

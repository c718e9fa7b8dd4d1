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


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3", "mistral", "phi3"])
def tiny(request, tiny_tokenizer):
    """``(model, tokenizer)`` of each supported architecture."""
    model, tokenizer = build_tiny_model(request.param, seed=1, tokenizer=tiny_tokenizer)
    return (randomise_qk_norms(model) if request.param == "qwen3" else model), tokenizer


def randomise_qk_norms(model, seed: int = 0):
    """Qwen3's q / k norm weights start at 1; distinct random values catch a swapped or skipped norm."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in model.model.layers:
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                norm.weight.copy_(0.5 + torch.rand(norm.weight.shape, generator=generator))
    return model


@pytest.fixture(scope="module")
def tiny_llama(tiny_tokenizer):
    return build_tiny_model("llama", seed=1, tokenizer=tiny_tokenizer)

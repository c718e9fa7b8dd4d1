"""Tiny models and chat prompts shared by the rollout tests."""

import pytest
import torch

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


def prefilled_paged_cache(decoder, prompts, *, device="cpu", block_size: int = 4, max_len: int = 64):
    """A paged cache holding ``prompts`` (``[L_i]`` tensors) prefilled, each in blocks handed out in reverse
    order so a row's blocks are neither contiguous nor ascending; returns ``(cache, block_tables [N, W] int32,
    positions [N])``."""
    import torch

    from hybridflow.rollout.kv_cache import PagedKVCache

    width = -(-max_len // block_size)
    cache = PagedKVCache(layers=decoder.num_layers, blocks=len(prompts) * width + 1, block_size=block_size,
                         kv_heads=decoder.kv_heads, max_len=max_len, head_dim=decoder.head_dim,
                         dtype=decoder.embed.dtype, device=device, parts=decoder.kv_parts)
    free = list(range(1, cache.blocks))
    tables = []
    for prompt, (_, kv) in zip(prompts, decoder.prefill_many(prompts)):
        blocks = [free.pop() for _ in range(-(-(len(prompt) + 1) // block_size))]  # room for the next token
        cache.write_prompt(blocks, kv, start=0)
        tables.append(blocks + [0] * (width - len(blocks)))
    positions = torch.tensor([len(p) for p in prompts], device=device)
    return cache, torch.tensor(tables, dtype=torch.int32, device=device), positions


def fused_and_eager_steps(decoder) -> dict:
    """``{fused: (logits [3, V], the pool after the step)}`` of one decode step, fused (C kernels) and eager (torch
    ops), over the same prefill: three rows at different positions in scattered blocks."""
    import torch

    generator = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, decoder.vocab_size, (length,), generator=generator) for length in (3, 17, 9)]
    steps = {}
    for fused in (True, False):
        decoder.fused_cpu_decode = fused
        cache, tables, positions = prefilled_paged_cache(decoder, prompts, block_size=4, max_len=32)
        decoder.rope_table(cache.max_len)
        logits = decoder.decode(token_ids=torch.tensor([5, 6, 7]), positions=positions, cache=cache,
                                block_tables=tables, context=int(positions.max()) + 1)
        steps[fused] = (logits, cache.data.clone())
    return steps


def assert_fused_step_equals_eager(decoder) -> None:
    """The fused step's logits and the keys and values it wrote agree with the torch step's to fp32 rounding."""
    import torch

    steps = fused_and_eager_steps(decoder)
    torch.testing.assert_close(steps[True][0], steps[False][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(steps[True][1], steps[False][1], rtol=1e-5, atol=1e-5)


def halved(model):
    """A copy of ``model`` with every weight halved: an engine built on it, then synced to ``model``."""
    import copy

    import torch

    other = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.mul_(0.5)
    return other


def assert_kernel_decodes_as_onednn(model, tokenizer, kernel_module, kernel_path_name: str, monkeypatch, *,
                                    atol: float) -> None:
    """The native engine on ``model``, greedy and sampled (seeded), with its projections on ``kernel_module``'s
    decode matmul kernel and on oneDNN's packed matmul (the kernel turned off): equal tokens, log-probs within
    ``atol`` (issue 56's bf16 and fp32 kernels). Issue 62: prefill runs on the kernel too (prompts of 129 and 257
    tokens cross its 128-row chunks), no oneDNN copy is kept beside the kernel's, and both engines are built on halved
    weights and synced to ``model``'s (the kernel's panels repacked in place)."""
    from hybridflow.rollout import SamplingParams
    from hybridflow.rollout.native import NativeEngine
    from hybridflow.rollout.packed_linear import PORTABLE_KERNELS_ENV

    monkeypatch.delenv(PORTABLE_KERNELS_ENV, raising=False)
    prompts = chat_prompts(tokenizer)
    prompts += [(prompts[0] * 40)[:129], (prompts[2] * 40)[:257]]
    params = [SamplingParams(n=1, temperature=0.0, max_tokens=16),
              SamplingParams(n=2, temperature=1.0, max_tokens=16, seed=0)]
    runs = {}
    for path in ("kernel", "oneDNN"):
        if path == "oneDNN":
            monkeypatch.setattr(kernel_module, "unavailable_reason", lambda: "turned off by the test")
        engine = NativeEngine(halved(model), tokenizer)
        engine.load_weights(model.state_dict().items())  # a weight sync: the kernel repacks in place
        assert (engine.decoder.lm_head.path == kernel_path_name) == (path == "kernel")
        assert (engine.decoder.layers[0].qkv.kernel_weight is not None) == (path == "kernel")
        assert (engine.decoder.layers[0].qkv.weight is None) == (path == "kernel")  # no oneDNN copy beside it
        runs[path] = [c for p in params for c in engine.generate(prompts, p)]
    for kernel, onednn in zip(runs["kernel"], runs["oneDNN"], strict=True):
        assert kernel.token_ids == onednn.token_ids
        torch.testing.assert_close(torch.tensor(kernel.logprobs), torch.tensor(onednn.logprobs), rtol=0, atol=atol)

"""The decode step without host values (``context=None``) is the step CUDA graphs capture: same logits
as the host-sized step, and ``torch.compile(fullgraph=True)`` traces it without a graph break."""

import pytest
import torch

from hybridflow.models.tiny import build_tiny_model
from hybridflow.rollout.cuda_graphs import bucket_sizes
from hybridflow.rollout.decoder import LlamaFamilyDecoder
from tests.rollout.conftest import chat_prompts, prefilled_paged_cache


def _decode_inputs(model, tokenizer):
    """A paged cache holding three prompts of different lengths, their block tables and next tokens."""
    decoder = LlamaFamilyDecoder(model)
    prompts = [torch.tensor(p) for p in chat_prompts(tokenizer)[:3]]
    cache, tables, positions = prefilled_paged_cache(decoder, prompts)
    return decoder, cache, tables, torch.tensor([5, 6, 7]), positions


def test_static_step_equals_the_host_sized_step(tiny, kernel_path):
    model, tokenizer = tiny
    decoder, cache, tables, tokens, positions = _decode_inputs(model, tokenizer)
    sized = decoder.decode(token_ids=tokens, positions=positions, cache=cache, block_tables=tables,
                           context=int(positions.max()) + 1)
    static = decoder.decode(token_ids=tokens, positions=positions, cache=cache, block_tables=tables, context=None)
    torch.testing.assert_close(static, sized, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gemma2", "mixtral"])  # plain; soft-capped and windowed; routed experts
def test_static_step_compiles_as_one_graph(arch, tiny_tokenizer, monkeypatch):
    from hybridflow.rollout.packed_linear import PORTABLE_KERNELS_ENV

    monkeypatch.setenv(PORTABLE_KERNELS_ENV, "1")  # oneDNN's packed ops are opaque to dynamo
    model, tokenizer = build_tiny_model(arch, seed=1, tokenizer=tiny_tokenizer)
    decoder, cache, tables, tokens, positions = _decode_inputs(model, tokenizer)
    eager = decoder.decode(token_ids=tokens, positions=positions, cache=cache, block_tables=tables, context=None)
    torch._dynamo.reset()
    step = torch.compile(decoder.decode, fullgraph=True, backend="eager")  # a graph break raises here
    compiled = step(token_ids=tokens, positions=positions, cache=cache, block_tables=tables, context=None)
    torch.testing.assert_close(compiled, eager)


@pytest.mark.parametrize("max_rows, sizes, expected", [
    (5, None, [1, 2, 4, 5]),
    (256, None, [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256]),
    (400, None, [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 400]),
    (64, [1, 8, 100], [1, 8, 64]),
])
def test_capture_buckets_cover_every_batch_size(max_rows, sizes, expected):
    assert bucket_sizes(max_rows, sizes) == expected


def test_gpt_oss_static_step_compiles_as_one_graph(tiny_tokenizer, monkeypatch):
    """gpt-oss's graph-safe step (sinks, alternating windows, its experts gathered) traces without a graph break."""
    test_static_step_compiles_as_one_graph("gpt_oss", tiny_tokenizer, monkeypatch)


def test_mla_static_step_compiles_as_one_graph(monkeypatch):
    """DeepSeek-V3's graph-safe step (latent cache write, rotary rows, group-limited routing with the experts gathered,
    attention over the gathered latents) traces without a graph break: nothing in it reads a value on the host."""
    from hybridflow.rollout.mla import MLADecoder
    from hybridflow.rollout.packed_linear import PORTABLE_KERNELS_ENV
    from tests.rollout.test_mla import deepseek

    monkeypatch.setenv(PORTABLE_KERNELS_ENV, "1")
    model, tokenizer = deepseek(kv_lora_rank=24)
    decoder = MLADecoder(model)
    decoder.paged_kernel = False  # the C kernel is a host call (the CUDA step's Triton kernel: test_triton_mla.py)
    prompts = [torch.tensor(p) for p in chat_prompts(tokenizer)[:3]]
    cache, tables, positions = prefilled_paged_cache(decoder, prompts)
    tokens = torch.tensor([5, 6, 7])
    eager = decoder.decode(token_ids=tokens, positions=positions, cache=cache, block_tables=tables, context=None)
    torch._dynamo.reset()
    step = torch.compile(decoder.decode, fullgraph=True, backend="eager")  # a graph break raises here
    compiled = step(token_ids=tokens, positions=positions, cache=cache, block_tables=tables, context=None)
    torch.testing.assert_close(compiled, eager)

"""The decode step without host values (``context=None``) is the step CUDA graphs capture: same logits
as the host-sized step, and ``torch.compile(fullgraph=True)`` traces it without a graph break."""

import pytest
import torch

from hybridflow.models.tiny import build_tiny_model
from hybridflow.rollout.cuda_graphs import bucket_sizes
from hybridflow.rollout.decoder import LlamaFamilyDecoder
from hybridflow.rollout.kv_cache import SlotKVCache
from tests.rollout.conftest import chat_prompts


def _decode_inputs(model, tokenizer):
    """A cache holding three prompts of different lengths in slots 0-2, and their next tokens."""
    decoder = LlamaFamilyDecoder(model)
    prompts = [torch.tensor(p) for p in chat_prompts(tokenizer)[:3]]
    cache = SlotKVCache(layers=decoder.num_layers, slots=4, kv_heads=decoder.kv_heads, max_len=64,
                        head_dim=decoder.head_dim, dtype=torch.float32, device="cpu")
    for slot, (logits, prefix) in enumerate(decoder.prefill_many(prompts)):
        cache.fill(first_slot=slot, count=1, prefix=prefix)
    tokens = torch.tensor([5, 6, 7])
    positions = torch.tensor(cache.lengths[:3])
    return decoder, cache, tokens, positions


def test_static_step_equals_the_host_sized_step(tiny, kernel_path):
    model, tokenizer = tiny
    decoder, cache, tokens, positions = _decode_inputs(model, tokenizer)
    sized = decoder.decode(token_ids=tokens, positions=positions, cache=cache, context=int(positions.max()) + 1)
    static = decoder.decode(token_ids=tokens, positions=positions, cache=cache, context=None)
    torch.testing.assert_close(static, sized, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gemma2", "mixtral"])  # plain; soft-capped and windowed; routed experts
def test_static_step_compiles_as_one_graph(arch, tiny_tokenizer, monkeypatch):
    from hybridflow.rollout.packed_linear import PORTABLE_KERNELS_ENV

    monkeypatch.setenv(PORTABLE_KERNELS_ENV, "1")  # oneDNN's packed ops are opaque to dynamo
    model, tokenizer = build_tiny_model(arch, seed=1, tokenizer=tiny_tokenizer)
    decoder, cache, tokens, positions = _decode_inputs(model, tokenizer)
    eager = decoder.decode(token_ids=tokens, positions=positions, cache=cache, context=None)
    torch._dynamo.reset()
    step = torch.compile(decoder.decode, fullgraph=True, backend="eager")  # a graph break raises here
    compiled = step(token_ids=tokens, positions=positions, cache=cache, context=None)
    torch.testing.assert_close(compiled, eager)


@pytest.mark.parametrize("max_rows, sizes, expected", [
    (5, None, [1, 2, 4, 5]),
    (256, None, [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256]),
    (400, None, [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 400]),
    (64, [1, 8, 100], [1, 8, 64]),
])
def test_capture_buckets_cover_every_batch_size(max_rows, sizes, expected):
    assert bucket_sizes(max_rows, sizes) == expected

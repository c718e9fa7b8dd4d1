"""The Triton decode kernels for the architectures of issue 58, against torch references: gpt-oss's attention sinks
(with its sliding windows) and GLM-4.5's partial rotary in the fused step. Compiled on a GPU, interpreted on CPU
(tests/conftest.py sets ``TRITON_INTERPRET=1`` where CUDA is absent). Skipped without Triton."""

import pytest
import torch

pytest.importorskip("triton")
pytestmark = pytest.mark.triton

from hybridflow.rollout.decoder import LlamaFamilyDecoder, _apply_rope  # noqa: E402
from hybridflow.rollout.triton_attention import DecodeConfig, paged_decode_attention  # noqa: E402
from hybridflow.rollout.triton_fused import qkv_rope_write  # noqa: E402
from tests.rollout.conftest import chat_prompts, prefilled_paged_cache  # noqa: E402
from tests.rollout.test_triton_kernels import scattered_tables  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def sink_reference(q, keys, values, lengths, scale, tables, sinks, window=None):
    """fp64: each head's scores over its row's keys (the last ``window``), with the head's sink logit appended as one
    more column of the softmax and dropped after (HF's gpt-oss ``eager_attention_forward``); ``[N, H, D]``."""
    group = q.shape[1] // keys.shape[0]
    out = []
    for n, length in enumerate(lengths):
        first = 0 if window is None else max(0, length - window)

        def row(pool):  # [H, L, D]
            return pool[:, tables[n]].flatten(1, 2)[:, first:length].double().repeat_interleave(group, 0)

        scores = torch.einsum("hd,hld->hl", q[n].double(), row(keys)) * scale
        with_sink = torch.cat([scores, sinks.double()[:, None]], dim=-1)
        weights = torch.softmax(with_sink, dim=-1)[:, :-1]
        out.append(torch.einsum("hl,hld->hd", weights, row(values)))
    return torch.stack(out)


@pytest.mark.parametrize("config", [None, DecodeConfig(split_len=64, block_n=32)])  # one split a row; several
@pytest.mark.parametrize("window", [None, 1, 70])
def test_sinks_join_each_heads_softmax_once_across_splits_and_windows(config, window):
    """Sinks from well below to well above the scores (a sink of +6 takes most of the weight), rows of 1 key to
    several splits, poisoned blocks no row may read; and a sink that is not one per head is refused."""
    torch.manual_seed(3)
    heads, kv_heads, head_dim, block_size = 6, 2, 32, 16
    lengths = [1, 15, 64, 65, 200]
    tables, blocks = scattered_tables(lengths, block_size=block_size, width=16, seed=3)
    q = torch.randn(len(lengths), heads, head_dim)
    keys, values = torch.randn(2, kv_heads, blocks, block_size, head_dim)
    keys[:, 0] = values[:, 0] = float("nan")
    sinks = torch.tensor([-4.0, -1.0, 0.0, 0.5, 2.0, 6.0])
    got = paged_decode_attention(q=q.to(DEVICE), keys=keys.to(DEVICE), values=values.to(DEVICE),
                                 lengths=torch.tensor(lengths, device=DEVICE), scale=head_dim**-0.5,
                                 block_tables=tables.to(DEVICE), window=window, sinks=sinks.to(DEVICE), config=config)
    expected = sink_reference(q, keys, values, lengths, head_dim**-0.5, tables.long(), sinks, window=window)
    torch.testing.assert_close(got.cpu().double(), expected, rtol=1e-5, atol=1e-5)
    without = paged_decode_attention(q=q.to(DEVICE), keys=keys.to(DEVICE), values=values.to(DEVICE),
                                     lengths=torch.tensor(lengths, device=DEVICE), scale=head_dim**-0.5,
                                     block_tables=tables.to(DEVICE), window=window, config=config)
    assert (without.cpu() - got.cpu()).abs().max() > 0.1  # the sinks change what a head attends to
    with pytest.raises(ValueError, match="sinks of shape"):
        paged_decode_attention(q=q.to(DEVICE), keys=keys.to(DEVICE), values=values.to(DEVICE),
                               lengths=torch.tensor(lengths, device=DEVICE), scale=1.0,
                               block_tables=tables.to(DEVICE), sinks=sinks[:2].to(DEVICE))


def fused_equals_torch_step(model, tokenizer, *, rope_positions=None):
    """One decode step of three prefilled prompts through the fused Triton step and through torch ops: logits and the
    cache written (keys and values) agree."""
    model = model.to(DEVICE)
    decoder = LlamaFamilyDecoder(model)
    prompts = [torch.tensor(p, device=DEVICE) for p in chat_prompts(tokenizer)[:3]]
    (torch_cache, tables, positions), (fused_cache, _, _) = (prefilled_paged_cache(decoder, prompts, device=DEVICE)
                                                             for _ in range(2))
    tokens = torch.tensor([5, 6, 7], device=DEVICE)
    decoder.triton_kernels = decoder.fused_cpu_decode = False  # the reference: torch ops (not the C kernels either)
    expected = decoder.decode(token_ids=tokens, positions=positions, cache=torch_cache, block_tables=tables,
                              context=int(positions.max()) + 1)
    decoder.triton_kernels = True
    fused = decoder.decode(token_ids=tokens, positions=positions, cache=fused_cache, block_tables=tables, context=None)
    torch.testing.assert_close(fused, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused_cache.data, torch_cache.data, rtol=1e-5, atol=1e-5)
    return decoder


def test_gpt_oss_fused_decode_step_equals_the_torch_step(tiny_tokenizer):
    """gpt-oss (sinks of std 1, a window of 8 on the first layer, prompts longer than it) through the Triton step."""
    from hybridflow.models.tiny import build_tiny_model

    model, tokenizer = build_tiny_model("gpt_oss", seed=1, tokenizer=tiny_tokenizer)
    decoder = fused_equals_torch_step(model, tokenizer)
    assert decoder.layers[0].sinks is not None and decoder.layers[0].window == 8

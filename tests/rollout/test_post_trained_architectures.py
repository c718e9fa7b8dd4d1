"""Issue 58: the native engine on OLMo 2, OLMo 3 and gpt-oss (tiny fp32 models built from HF's config classes).

What the shared architecture tests (the ``tiny`` fixture: greedy parity on a ragged batch, preemption, chunked
prefill, prefix sharing, packed prefill, the graph-safe step) do not pin: log-probs within 1e-5 of HF's forward, every
decode step through the fused C step, and the new ops by hand (the sinks in the C attention kernel, gpt-oss's clamped
SwiGLU and routing)."""

import math

import pytest
import torch

from hybridflow.models.segment_attention import capped_attention
from hybridflow.models.tiny import build_tiny_model
from hybridflow.rollout import SamplingParams, build_engine, cpu_attention, cpu_kernels
from hybridflow.rollout.moe import clamped_swiglu, gpt_oss_expert_weights, moe_mlp, route
from hybridflow.rollout.native import NativeEngine
from tests.rollout.conftest import chat_prompts, randomise_norms
from tests.rollout.test_native import count_fused_steps, hf_greedy, teacher_forced_logits

NEW = ["olmo2", "olmo3", "gpt_oss"]
needs_kernels = pytest.mark.skipif(cpu_kernels.library() is None, reason="no C compiler: the kernels are not built")


@pytest.fixture(scope="module", params=NEW)
def new_model(request, tiny_tokenizer):
    model, tokenizer = build_tiny_model(request.param, seed=1, tokenizer=tiny_tokenizer)
    return randomise_norms(model), tokenizer


def test_sampled_log_probs_are_hf_forwards_within_1e_5(new_model, kernel_path):
    model, tokenizer = new_model
    prompts = chat_prompts(tokenizer)  # four prompts of different lengths, sampled together
    params = SamplingParams(n=2, temperature=1.0, max_tokens=20, seed=3)
    engine = build_engine("native", model, tokenizer)
    assert isinstance(engine, NativeEngine)
    for completion in engine.generate(prompts, params):
        logits = teacher_forced_logits(model, prompts[completion.prompt_index], completion.token_ids)
        expected = logits.log_softmax(-1).gather(-1, torch.tensor(completion.token_ids)[:, None]).squeeze(-1)
        torch.testing.assert_close(torch.tensor(completion.logprobs), expected, rtol=0, atol=1e-5)


@needs_kernels
def test_every_decode_step_runs_fused_and_greedy_equals_hf(new_model, kernel_path):
    """OLMo's missing pre-norms and whole-projection q / k norms, and gpt-oss's sinks (the C attention kernel), in
    the fused CPU step: every step of it, token for token with HF ``generate``."""
    model, tokenizer = new_model
    prompts = chat_prompts(tokenizer)
    eos = tokenizer.eos_token_id
    engine = build_engine("native", model, tokenizer)
    assert engine.decoder.fused_cpu_decode and engine.decoder.paged_cpu_attention
    calls = count_fused_steps(engine)
    completions = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=16, stop_token_ids=[eos]))
    assert [c.token_ids for c in completions] == [hf_greedy(model, p, max_new_tokens=16, eos=eos) for p in prompts]
    assert len(calls) >= max(len(c.token_ids) for c in completions) - 1


@needs_kernels
def test_a_sink_joins_the_softmax_by_hand():
    """One head, scores (0, ln 3) and a sink of ln 4: weights 1/8 and 3/8 (the sink's 4/8 is dropped)."""
    dim = 16
    q = torch.zeros(1, 1, dim)
    q[0, 0, 0] = 1.0
    keys, values = torch.zeros(1, 3, 1, dim), torch.zeros(1, 3, 1, dim)
    keys[0, 1, 0, 0] = math.log(3.0)  # position 1 lives in block 1, position 0 in block 2
    values[0, 2, 0] = torch.arange(dim, dtype=torch.float32)
    values[0, 1, 0] = 100.0
    out = cpu_attention.paged_decode_attention(q=q, keys=keys, values=values,
                                               block_tables=torch.tensor([[2, 1]], dtype=torch.int32),
                                               lengths=torch.tensor([2]), scale=1.0, window=None,
                                               sinks=torch.tensor([math.log(4.0)]))
    torch.testing.assert_close(out[0, 0], torch.arange(dim, dtype=torch.float32) / 8 + 3 * 100.0 / 8)


@needs_kernels
@pytest.mark.parametrize("window", [None, 5])
def test_the_kernels_sinks_equal_the_eager_softmax_with_sinks(window):
    generator = torch.Generator().manual_seed(0)
    rows, heads, kv_heads, dim, block, width = 5, 6, 2, 32, 4, 6
    keys, values = (torch.randn(kv_heads, rows * width + 1, block, dim, generator=generator) for _ in range(2))
    q = torch.randn(rows, heads, dim, generator=generator)
    sinks = 2 * torch.randn(heads, generator=generator)
    tables = torch.randperm(rows * width, generator=generator).add(1).view(rows, width).to(torch.int32)
    lengths = torch.tensor([1, 7, 13, 20, 24])
    out = cpu_attention.paged_decode_attention(q=q, keys=keys, values=values, block_tables=tables, lengths=lengths,
                                               scale=dim**-0.5, window=window, sinks=sinks)
    for n in range(rows):
        positions = torch.arange(int(lengths[n]))
        slots = tables[n, positions // block].long() * block + positions % block
        key, value = (part.reshape(kv_heads, -1, dim)[:, slots] for part in (keys, values))
        mask = torch.ones(1, len(positions), dtype=torch.bool)
        if window is not None:
            mask &= positions[None] > len(positions) - 1 - window
        expected = capped_attention(q[n][:, None], key, value, mask=mask, scale=dim**-0.5, softcap=None,
                                    sinks=sinks, grouped=True)[:, 0]
        torch.testing.assert_close(out[n], expected, rtol=1e-5, atol=1e-6)


def test_the_clamped_swiglu_by_hand():
    """Interleaved [g0, u0, g1, u1] = [2, 0.5, -1, 3], limit 1, alpha 1: g -> (1, -1), u -> (0.5, 1);
    (u + 1) g sigmoid(g) = (1.5 sigmoid(1), -2 sigmoid(-1))."""
    out = clamped_swiglu(torch.tensor([[2.0, 0.5, -1.0, 3.0]]), alpha=1.0, limit=1.0)
    sigmoid = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    torch.testing.assert_close(out, torch.tensor([[1.5 * sigmoid(1.0), -2 * sigmoid(-1.0)]]))


def test_gpt_oss_routing_and_experts_equal_hfs_block(tiny_tokenizer, kernel_path):
    """Router with a bias, softmax over the k selected logits, experts with biases and the clamped SwiGLU (the tiny
    model's limit of 0.2 clamps): both the grouped and the gathered (graph-safe) path equal HF's MLP block."""
    model, _ = build_tiny_model("gpt_oss", seed=1, tokenizer=tiny_tokenizer)
    mlp = model.model.layers[0].mlp
    hidden = torch.randn(9, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    experts = gpt_oss_expert_weights(mlp)
    with torch.no_grad():
        gate_up = hidden @ mlp.experts.gate_up_proj[0] + mlp.experts.gate_up_proj_bias[0]
        assert (gate_up.abs() > mlp.experts.limit).any()  # the clamp bites
        _, hf_scores, hf_ids = mlp.router(hidden)
        weights, ids = route(hidden, experts)
        torch.testing.assert_close(weights, hf_scores, rtol=0, atol=0)
        assert torch.equal(ids, hf_ids)
        expected = mlp(hidden[None])[0][0]
        for graph_safe in (False, True):
            got = moe_mlp(hidden, experts, torch.nn.functional.silu, graph_safe=graph_safe)
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arch", ["olmo2", "gpt_oss"])
def test_a_weight_sync_writes_into_the_decoders_own_tensors(tiny_tokenizer, arch, monkeypatch):
    """Unpacked (the CUDA path), a sync writes OLMo's whole-projection q / k norms and gpt-oss's sinks in place: no
    tensor is replaced and the epoch stays (captured CUDA graphs keep reading the right memory)."""
    from hybridflow.rollout.packed_linear import PORTABLE_KERNELS_ENV

    monkeypatch.setenv(PORTABLE_KERNELS_ENV, "1")
    model, tokenizer = build_tiny_model(arch, seed=1, tokenizer=tiny_tokenizer)
    other, _ = build_tiny_model(arch, seed=4, tokenizer=tiny_tokenizer)
    randomise_norms(other)
    decoder = NativeEngine(model, tokenizer).decoder
    tensors = [t for layer in decoder.layers for t in (layer.qkv.weight, layer.qk_proj_norm, layer.sinks)
               if t is not None]
    pointers, epoch = [t.data_ptr() for t in tensors], decoder.weights_epoch
    decoder.load_weights(other.state_dict().items())
    assert [t.data_ptr() for t in tensors] == pointers and decoder.weights_epoch == epoch
    logits, _ = decoder.prefill(torch.tensor(chat_prompts(tokenizer)[0]))
    torch.testing.assert_close(logits, other(torch.tensor([chat_prompts(tokenizer)[0]])).logits[0, -1],
                               rtol=1e-5, atol=1e-5)

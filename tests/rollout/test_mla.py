"""DeepSeek-V3 in the native engine (issue 58): multi-head latent attention over a paged cache of compressed latents,
and sigmoid group-limited routing with shared experts, against HF's own model (fp32, tiny random configs)."""

import pytest
import torch

from hybridflow.rollout import SamplingParams, cpu_attention
from hybridflow.rollout.grouped_moe import GroupedMoE, grouped_route
from hybridflow.rollout.mla import MLADecoder
from hybridflow.rollout.native import NativeEngine
from tests.models.non_native import build_non_native
from tests.rollout.conftest import chat_prompts, randomise_norms
from tests.rollout.test_chunked_prefill import mixed_prompts
from tests.rollout.test_native import hf_greedy
from tests.rollout.test_paged_engine import assert_greedy_as_hf, tight_blocks

YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 256,
        "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0}
VARIANTS = {
    "q_lora+interleaved": dict(kv_lora_rank=24),  # latent width 32: the CPU attention kernel where it is built
    "q_proj+rotate_half": dict(q_lora_rank=None, rope_interleave=False),
    "yarn_mscale": dict(rope_parameters=YARN),
}
"""DeepSeek-V3's own layout (query compression, interleaved rope); Kimi-style uncompressed queries with HF's rotate-half
layout; and YaRN with ``mscale_all_dim`` (the softmax scale grows by mscale^2). The last two have latents 24 wide,
which the CPU kernel does not take: their decode steps gather the blocks for SDPA."""


def deepseek(seed: int = 1, **overrides):
    """A tiny random DeepSeek-V3 (2 layers: dense then sparse; 4 experts in 2 groups, 1 shared) with random norms and
    a random routing bias, so a skipped norm or bias changes the numbers."""
    model, tokenizer = build_non_native("deepseek_v3", seed=seed, **overrides)
    randomise_norms(model, seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None:
                gate.e_score_correction_bias.copy_(torch.randn(gate.e_score_correction_bias.shape,
                                                               generator=generator) * 0.2)
    return model, tokenizer


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_and_logprobs_equal_hf_under_chunking_preemption_and_prefix_sharing(variant):
    """Ragged prompts (one long), two samples each and a twin prompt sharing blocks, a prefix cache, chunked prefill
    (chunks starting inside a block) and too few blocks (preemption, recomputed later): HF's greedy tokens, and the
    log-probs of HF's forward within 1e-5."""
    model, tokenizer = deepseek(**VARIANTS[variant])
    prompts, eos = mixed_prompts(tokenizer), tokenizer.eos_token_id
    params = SamplingParams(n=2, temperature=0, max_tokens=24, stop_token_ids=[eos], logprobs=True)
    engine = NativeEngine(model, tokenizer, max_num_seqs=5, max_num_batched_tokens=17, enable_chunked_prefill=True,
                          prefix_cache_tokens=4096, num_kv_blocks=tight_blocks(prompts, 24, spare=3),
                          decode_lanes=False)
    assert isinstance(engine.decoder, MLADecoder)
    assert engine.decoder.paged_kernel == (variant == "q_lora+interleaved" and cpu_attention.supports(
        dtype=torch.float32, heads=4, kv_heads=1, head_dim=32))
    assert_greedy_as_hf(engine, model, prompts, params, eos=eos)
    assert engine.allocator.available == engine.allocator.num_blocks - 1  # every block came back (or is cached)


def test_the_cache_holds_hfs_latent_and_rotated_key_only():
    """One part a token and layer, ``kv_lora_rank + qk_rope_head_dim`` wide: HF's own cache entries (the normed
    latent, the rotated shared key), and nothing per head."""
    model, tokenizer = deepseek()
    ids = torch.tensor(chat_prompts(tokenizer)[2])
    (_, latents), = MLADecoder(model).prefill_many([ids])
    config = model.config
    assert latents.shape == (2, 1, 1, len(ids), config.kv_lora_rank + config.qk_rope_head_dim)
    with torch.no_grad():
        cache = model(input_ids=ids[None], use_cache=True).past_key_values
    for index, layer in enumerate(cache.layers):
        torch.testing.assert_close(latents[index, 0, 0, :, : config.kv_lora_rank], layer.keys[0, 0], atol=1e-6, rtol=0)
        torch.testing.assert_close(latents[index, 0, 0, :, config.kv_lora_rank :], layer.values[0, 0], atol=1e-6,
                                   rtol=0)
    engine = NativeEngine(model, tokenizer)
    engine.generate([ids.tolist()], SamplingParams(temperature=0, max_tokens=2))
    assert engine.pool.cache.data.shape[1:3] == (1, 1) and engine.pool.cache.data.shape[-1] == 24


def test_the_kernel_and_the_gathered_step_agree():
    """One decode step over the same latents, through the CPU kernel (query heads in groups) and through SDPA over
    the gathered blocks; skipped where the kernel is not built."""
    model, tokenizer = deepseek(kv_lora_rank=24)
    decoder = MLADecoder(model)
    if not decoder.paged_kernel:
        pytest.skip("the CPU attention kernel is not built here")
    from tests.rollout.conftest import prefilled_paged_cache

    prompts = [torch.tensor(p) for p in chat_prompts(tokenizer)]
    cache, tables, positions = prefilled_paged_cache(decoder, prompts)
    decoder.head_group = 2  # two kernel rows per sequence: the head split is exercised too
    tokens = torch.tensor([5, 6, 7, 8])
    kernel = decoder.decode(token_ids=tokens, positions=positions, cache=cache, block_tables=tables,
                            context=int(positions.max()) + 1)
    decoder.paged_kernel = False
    gathered = decoder.decode(token_ids=tokens, positions=positions, cache=cache, block_tables=tables,
                              context=int(positions.max()) + 1)
    torch.testing.assert_close(kernel, gathered, atol=1e-5, rtol=1e-5)


def test_group_limited_routing_by_hand():
    """Scores sigmoid([0, 1, 2, -1]); the bias makes group {2, 3} (best two: 0.381 + 0.869) beat {0, 1}
    (0.5 + 0.731), although without groups experts 3 and 1 would win; the weights are the unbiased scores of 2 and
    3, renormalised and scaled by 2.5."""
    moe = GroupedMoE(router=torch.tensor([[0.0], [1.0], [2.0], [-1.0]]),
                     correction_bias=torch.tensor([0.0, 0.0, -0.5, 0.6]), groups=2, topk_group=1, top_k=2,
                     norm_topk_prob=True, scaling=2.5, experts=None, shared=None)
    weights, ids = grouped_route(torch.ones(1, 1), moe)
    order = ids[0].argsort()
    assert ids[0][order].tolist() == [2, 3]
    s2, s3 = 0.8807970779778823, 0.2689414213699951
    torch.testing.assert_close(weights[0][order], torch.tensor([s2, s3]) / (s2 + s3) * 2.5)
    moe.norm_topk_prob = False
    weights, ids = grouped_route(torch.ones(1, 1), moe)
    torch.testing.assert_close(weights[0][ids[0].argsort()], torch.tensor([s2, s3]) * 2.5)


def test_new_weights_switch_the_policy_experts_included():
    """``load_weights`` with another model's tensors: the engine answers as that model does (the routed experts are
    packed copies, rebuilt)."""
    model, tokenizer = deepseek(seed=1)
    other, _ = deepseek(seed=2)
    prompts, eos = chat_prompts(tokenizer), tokenizer.eos_token_id
    params = SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[eos])
    engine = NativeEngine(model, tokenizer, own_model=True)
    before = [c.token_ids for c in engine.generate(prompts, params)]
    engine.load_weights(list(other.state_dict().items()))
    after = [c.token_ids for c in engine.generate(prompts, params)]
    assert after == [hf_greedy(other, p, max_new_tokens=12, eos=eos) for p in prompts] and after != before


def test_the_sparse_layers_run_the_c_experts_kernel(monkeypatch, kernel_path):
    """HF's experts carry SiLU as a module (``act_fn``): the decoder passes ``F.silu`` so that every sparse layer's
    routed and shared experts run as the one C call on CPU (fp32), and greedy decoding is still HF's (the projections
    oneDNN-packed, and ``F.linear`` as on a CPU without the packing)."""
    from hybridflow.rollout import cpu_kernels, grouped_moe
    from hybridflow.rollout.packed_linear import onednn_packing_available

    if cpu_kernels.library() is None:
        pytest.skip("no C compiler: the kernels are not built")
    real, ran = grouped_moe.routed_experts, []

    def counted(*args, **kwargs):
        out = real(*args, **kwargs)
        ran.append(out is not None)
        return out

    monkeypatch.setattr(grouped_moe, "routed_experts", counted)
    model, tokenizer = deepseek()
    prompts, eos = chat_prompts(tokenizer), tokenizer.eos_token_id
    engine = NativeEngine(model, tokenizer)
    packing = kernel_path != "portable-kernels" and onednn_packing_available(model.lm_head.weight)
    assert engine.decoder.lm_head.packed == engine.decoder.projections[1].o.packed == packing
    completions = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[eos]))
    assert ran and all(ran)
    assert [c.token_ids for c in completions] == [hf_greedy(model, p, max_new_tokens=12, eos=eos) for p in prompts]

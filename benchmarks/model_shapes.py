"""Random-init models shaped like real ones (config only, no download), for speed measurements.

A random model is as fast as the trained one of the same shape: the matmuls, the attention and
the cache are the same sizes. It does not stop like one (no EOS), so speed workloads ignore EOS.
"""

from __future__ import annotations

SHAPES = {
    # HuggingFaceTB/SmolLM2-135M-Instruct
    "smollm2-135m": dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True,
                         max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0),
    # Qwen/Qwen3-0.6B (nano-vllm's benchmark model)
    "qwen3-0.6b": dict(model_type="qwen3", hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                       tie_word_embeddings=True, max_position_embeddings=40960, rms_norm_eps=1e-6,
                       rope_theta=1000000.0),
    # Qwen/Qwen2.5-0.5B-Instruct
    "qwen2.5-0.5b": dict(model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                         max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0),
    # Qwen/Qwen2.5-1.5B-Instruct
    "qwen2.5-1.5b": dict(model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                         max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0),
    # google/gemma-2-2b's config.json. Sure of every value (the Gemma 2 report's 2B row agrees: 26 layers, d_model 2304,
    # 8 heads of 256, 4 KV heads, MLP 9216, 256k vocabulary, window 4096, caps 50 / 30); layers alternate local / global
    # (transformers' default layer_types for gemma2).
    "gemma2-2b": dict(model_type="gemma2", hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=256, vocab_size=256000,
                      query_pre_attn_scalar=256, sliding_window=4096, attn_logit_softcapping=50.0,
                      final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                      max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=10000.0),
    # google/gemma-3-1b-it's config.json (gemma3_text). Sure of the dims, heads, vocabulary (262144), window 512,
    # the pattern of 5 local layers then 1 global (its sliding_window_pattern 6, written out as layer_types) and the two
    # rotary bases (rope_local_base_freq 10000 local, rope_theta 1e6 global); no caps, no rope scaling at 1B. Less sure:
    # max_position_embeddings 32768 (the 1B's 32k context; the larger Gemma 3 have 131072).
    "gemma3-1b": dict(model_type="gemma3_text", hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
                      num_attention_heads=4, num_key_value_heads=1, head_dim=256, vocab_size=262144,
                      query_pre_attn_scalar=256, sliding_window=512,
                      layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(26)],
                      rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                       "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
                      hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, max_position_embeddings=32768,
                      rms_norm_eps=1e-6),
    # Qwen/Qwen3-30B-A3B's config.json. Sure of: hidden 2048, 48 layers, 32 heads / 4 KV of 128 (so q is 4096 wide,
    # twice hidden), 128 experts, top-8, moe_intermediate_size 768, norm_topk_prob, every layer sparse
    # (decoder_sparse_step 1, no mlp_only_layers), vocabulary 151936, rope_theta 1e6, untied head. intermediate_size
    # 6144 is the (unused) dense MLP width; max_position_embeddings 40960 as the other Qwen3, less sure.
    "qwen3-30b-a3b": dict(model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144, num_hidden_layers=48,
                          num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
                          num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True, decoder_sparse_step=1,
                          mlp_only_layers=[], vocab_size=151936, tie_word_embeddings=False,
                          max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0),
}
SHAPES["tiny"] = dict(  # the smallest Qwen2.5-like shape: the CPU smoke runs of benchmarks/update.py and loop_step.py
    model_type="qwen2", hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=1024, tie_word_embeddings=True, max_position_embeddings=32768,
    rms_norm_eps=1e-6, rope_theta=1e6)
SHAPES["tiny-kv"] = dict(  # a KV cache large for its compute (32 KB a token in fp32, 3.7M parameters): the CPU run of
    # loop_step.py that shows rollout.free_cache_engine's handoff in a minute or two (docs/benchmarks.md)
    model_type="llama", hidden_size=128, intermediate_size=256, num_hidden_layers=16, num_attention_heads=8,
    num_key_value_heads=8, head_dim=32, vocab_size=1024, tie_word_embeddings=True, max_position_embeddings=2048,
    rms_norm_eps=1e-6)
_TINY = dict(hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
             vocab_size=8192, max_position_embeddings=2048, rms_norm_eps=1e-6)
SHAPES.update({  # one small config of each architecture of hybridflow/rollout/architectures.py, for CPU runs
    "tiny-llama": dict(model_type="llama", tie_word_embeddings=True, **_TINY),
    "tiny-mistral": dict(model_type="mistral", sliding_window=2048, tie_word_embeddings=False, **_TINY),
    "tiny-qwen2": dict(model_type="qwen2", tie_word_embeddings=True, **_TINY),
    "tiny-qwen3": dict(model_type="qwen3", head_dim=64, tie_word_embeddings=True, **_TINY),
    "tiny-phi3": dict(model_type="phi3", tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                      **_TINY),
})
_GEMMA = dict(head_dim=32, query_pre_attn_scalar=32, sliding_window=32, tie_word_embeddings=True)
SHAPES.update({  # the architectures issue 36 added; windows of 32 so that they bite in a 64 + 64 token workload
    "tiny-mistral-window": dict(model_type="mistral", sliding_window=32, tie_word_embeddings=False, **_TINY),
    "tiny-gemma2": dict(model_type="gemma2", **_GEMMA, **_TINY),  # layers alternate local / global; caps 50 / 30
    "tiny-gemma3": dict(model_type="gemma3_text", **_GEMMA, **{**_TINY, "num_hidden_layers": 4},
                        layer_types=["sliding_attention"] * 3 + ["full_attention"]),
    "tiny-mixtral": dict(model_type="mixtral", num_local_experts=8, num_experts_per_tok=2, tie_word_embeddings=False,
                         **_TINY),
    "tiny-qwen3-moe": dict(model_type="qwen3_moe", head_dim=32, num_experts=8, num_experts_per_tok=2,
                           moe_intermediate_size=352, norm_topk_prob=True, tie_word_embeddings=True, **_TINY),
})
SHAPES.update({  # issue 58: OLMo 2 / 3 and gpt-oss (windows of 32, as above; gpt-oss's YaRN over 32 x 4096 positions)
    "tiny-olmo2": dict(model_type="olmo2", tie_word_embeddings=False, **_TINY),
    "tiny-olmo3": dict(model_type="olmo3", sliding_window=32, tie_word_embeddings=False,
                       layer_types=["sliding_attention"] * 3 + ["full_attention"], **_TINY),
    "tiny-gpt-oss": dict(model_type="gpt_oss", head_dim=32, num_local_experts=8, num_experts_per_tok=2,
                         sliding_window=32, layer_types=["sliding_attention", "full_attention"] * 2,
                         tie_word_embeddings=False, **{**_TINY, "max_position_embeddings": 131072}),
})
SHAPES.update({  # issue 58: DeepSeek-V3 (MLA: latent 64 + rope 32, the CPU kernel's 16s) and GLM-4.5 (half rotary);
    # 8 routed experts in 2 groups (1 kept), top 2, one shared, the first layer dense
    "tiny-deepseek-v3": dict(model_type="deepseek_v3", num_key_value_heads=8, q_lora_rank=96, kv_lora_rank=64,
                             qk_rope_head_dim=32, qk_nope_head_dim=32, v_head_dim=32, n_routed_experts=8,
                             num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1,
                             moe_intermediate_size=352, first_k_dense_replace=1, tie_word_embeddings=False,
                             **{k: v for k, v in _TINY.items() if k != "num_key_value_heads"}),
    "tiny-glm4-moe": dict(model_type="glm4_moe", head_dim=32, partial_rotary_factor=0.5, attention_bias=True,
                          n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1,
                          moe_intermediate_size=352, first_k_dense_replace=1, tie_word_embeddings=False, **_TINY),
    # SmolLM2-135M's width, depth, heads and vocabulary as a DeepSeek-V3 (MLA latent 128 + rope 64; 8 experts of
    # 192, top 2, one shared: 3 x 192 active, about SmolLM2's MLP of 1536 in FLOPs): 155M parameters
    "smollm2-deepseek-v3": dict(model_type="deepseek_v3", hidden_size=576, intermediate_size=1536,
                                num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=9, q_lora_rank=None,
                                kv_lora_rank=128, qk_rope_head_dim=64, qk_nope_head_dim=64, v_head_dim=64,
                                n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=2,
                                topk_group=1, moe_intermediate_size=192, first_k_dense_replace=1, vocab_size=49152,
                                tie_word_embeddings=True, max_position_embeddings=8192, rms_norm_eps=1e-5),
})


def random_model(shape: str, *, dtype: str = "bfloat16", device: str = "cuda", seed: int = 0):
    """An HF causal LM of ``shape`` with random weights, built directly on ``device``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if shape not in SHAPES:
        raise SystemExit(f"unknown --shape {shape!r}; choose one of {', '.join(SHAPES)}")
    fields = dict(SHAPES[shape])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    return model.eval().requires_grad_(False)


# Vision-language shapes (benchmarks/vl_rollout.py): Qwen2.5-VL's architecture, ``text`` the language model's fields,
# ``vision`` the tower's (Qwen2_5_VLVisionConfig). The tokenizer is the tiny one (its vision token ids go into the
# config); a vocabulary larger than it only widens the embedding and the LM head, as in the real model.
_QWEN2_5_VL_VISION = dict(patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                          hidden_act="silu")
VL_SHAPES = {
    # Qwen/Qwen2.5-VL-3B-Instruct's config.json: a Qwen2.5-3B language model under the 32-block, 1280-wide tower
    # (windowed attention except blocks 7, 15, 23, 31), whose merger projects 2x2 patches to the text width.
    "qwen2.5-vl-3b": dict(
        text=dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                  num_key_value_heads=2, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
                  max_position_embeddings=128000, rms_norm_eps=1e-6,
                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]}),
        vision=dict(_QWEN2_5_VL_VISION, depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16,
                    out_hidden_size=2048, fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2)),
    # What a 2-core CPU decodes in about a minute: SmolLM2-135M's text dims (the language model of SmolVLM-256M)
    # under a ViT-B-sized tower (12 blocks of 768, 12 heads, MLP 3072: SmolVLM-256M's SigLIP-B/16 encoder's size),
    # windowed except every third block as Qwen2.5-VL's tower. M-RoPE sections 8/12/12 split head_dim 64's 32
    # frequencies in the proportions of the real 16/24/24 over 64.
    "qwen2.5-vl-smollm2-135m": dict(
        text=dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                  num_key_value_heads=3, head_dim=64, vocab_size=49152, tie_word_embeddings=True,
                  max_position_embeddings=8192, rms_norm_eps=1e-5,
                  rope_parameters={"rope_type": "default", "rope_theta": 100000.0, "mrope_section": [8, 12, 12]}),
        vision=dict(_QWEN2_5_VL_VISION, depth=12, hidden_size=768, intermediate_size=3072, num_heads=12,
                    out_hidden_size=576, fullatt_block_indexes=[2, 5, 8, 11], tokens_per_second=2)),
}


def random_vl_model(shape: str, tokenizer, *, dtype: str = "bfloat16", device: str = "cuda", seed: int = 0):
    """A Qwen2.5-VL of ``shape`` (:data:`VL_SHAPES`, or ``"tiny"``: hybridflow's tiny VL model) with random weights,
    built directly on ``device``, its vision token ids those of ``tokenizer`` (the tiny VL processor's)."""
    import torch
    import transformers

    from hybridflow.models.tiny import tiny_vl_config

    if shape != "tiny" and shape not in VL_SHAPES:
        raise SystemExit(f"unknown --shape {shape!r}; choose one of tiny, {', '.join(VL_SHAPES)}")
    fields = {} if shape == "tiny" else VL_SHAPES[shape]
    config = tiny_vl_config(tokenizer, vision=fields.get("vision"), **fields.get("text", {}))
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.Qwen2_5_VLForConditionalGeneration._from_config(config, dtype=getattr(torch, dtype))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval().requires_grad_(False)

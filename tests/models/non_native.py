"""Tiny random models built from the installed transformers' config classes (issue 58): architectures outside the
native engine's table (granite, smollm3: they roll out through HF generate and train through the guarded layouts),
and ones that were outside it until issue 58 made them native (olmo2, glm4_moe, deepseek_v3, gpt_oss)."""

from __future__ import annotations

import torch

from hybridflow.models.tiny import TINY_WINDOW, build_tiny_tokenizer

MOE = dict(n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=32,
           first_k_dense_replace=1)
NON_NATIVE = {
    "granite": ("GraniteConfig", dict(embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.2,
                                      logits_scaling=1.5)),  # outside the native table: scales Llama does not have
    "smollm3": ("SmolLM3Config", {}),  # outside the native table: layers without rotary (no_rope_layers)
    "olmo2": ("Olmo2Config", {}),  # norms after attention / MLP, q / k norms over all heads
    "glm4_moe": ("Glm4MoeConfig", dict(MOE, head_dim=16, partial_rotary_factor=0.5, n_group=1, topk_group=1)),
    "deepseek_v3": ("DeepseekV3Config", dict(MOE, num_key_value_heads=4, n_group=2, topk_group=1, q_lora_rank=32,
                                             kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16,
                                             v_head_dim=16, head_dim=8)),
    "gpt_oss": ("GptOssConfig", dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2, intermediate_size=64,
                                     max_position_embeddings=131072,  # its YaRN: 32 x 4096
                                     sliding_window=TINY_WINDOW, layer_types=["sliding_attention", "full_attention"])),
}
"""model_type -> (config class, fields beyond the common tiny ones: 2 layers, hidden 64, 4 heads)."""


def non_native_config(arch: str, tokenizer, **overrides):
    import transformers

    name, fields = NON_NATIVE[arch]
    common = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                  tie_word_embeddings=False, bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id)
    return getattr(transformers, name)(**{**common, **fields, **overrides})


def build_non_native(arch: str, *, seed: int = 0, tokenizer=None, sinks_std: float = 1.0, **overrides):
    """``(model, tokenizer)``: a random fp32 model of ``arch``; gpt-oss's sinks drawn with ``sinks_std`` (HF's
    0.02 would hide a path that drops them)."""
    from transformers import AutoModelForCausalLM

    tokenizer = tokenizer or build_tiny_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(non_native_config(arch, tokenizer, **overrides), dtype=torch.float32)
        with torch.no_grad():
            for module in model.modules():
                if isinstance(getattr(module, "sinks", None), torch.nn.Parameter):
                    module.sinks.normal_(0.0, sinks_std)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def save_non_native(path: str, arch: str, *, seed: int = 0, **overrides) -> str:
    model, tokenizer = build_non_native(arch, seed=seed, **overrides)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path

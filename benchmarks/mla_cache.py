"""Decode memory of DeepSeek-V3's latent KV cache (issue 58): bytes per token per layer of the native engine's pool,
measured from the allocated tensor, against the full keys and values the same model's heads attend to (measured as
the tensors HF's ``expand_kv`` builds from the latent, which a cache without MLA would have to hold).

    python benchmarks/mla_cache.py                     # tiny (hidden 64) and small (hidden 512) random models
    python benchmarks/mla_cache.py --save-dir /tmp/ds  # also write the small model (for benchmarks/rollout.py)
    python benchmarks/mla_cache.py --save-glm-dir /tmp/glm  # and a GLM-4.5 of the same size (its speed only)

The real DeepSeek-V3 shape (128 heads, kv_lora_rank 512, rope 64, nope 128, v 128) is printed from the same
formula the measured numbers check: ``kv_lora_rank + qk_rope_head_dim`` against ``H * (qk_head_dim + v_head_dim)``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hybridflow.models.tiny import build_tiny_tokenizer  # noqa: E402
from hybridflow.rollout import SamplingParams  # noqa: E402
from hybridflow.rollout.native import NativeEngine  # noqa: E402

SHAPES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32,
                 kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, head_dim=8),
    "small": dict(hidden_size=512, intermediate_size=1024, num_attention_heads=16, num_key_value_heads=16,
                  q_lora_rank=192, kv_lora_rank=128, qk_rope_head_dim=32, qk_nope_head_dim=64, v_head_dim=64,
                  head_dim=32),
}
DEEPSEEK_V3 = dict(num_attention_heads=128, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)


def build(shape: str, tokenizer):
    from transformers import AutoModelForCausalLM, DeepseekV3Config

    config = DeepseekV3Config(vocab_size=len(tokenizer), num_hidden_layers=4, max_position_embeddings=4096,
                              n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1,
                              moe_intermediate_size=SHAPES[shape]["intermediate_size"] // 4, first_k_dense_replace=1,
                              tie_word_embeddings=False, bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id, **SHAPES[shape])
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def save_small_glm(path: str, tokenizer) -> None:
    """A random GLM-4.5 of the small shape's size (its heads of 32, half rotary), for benchmarks/rollout.py."""
    from transformers import AutoModelForCausalLM, Glm4MoeConfig

    config = Glm4MoeConfig(vocab_size=len(tokenizer), hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                           num_attention_heads=16, num_key_value_heads=4, head_dim=32, partial_rotary_factor=0.5,
                           max_position_embeddings=4096, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                           n_group=2, topk_group=1, moe_intermediate_size=256, first_k_dense_replace=1,
                           attention_bias=True, tie_word_embeddings=False, bos_token_id=None,
                           eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    tokenizer.save_pretrained(path)


def full_kv_bytes_per_token(model, tokens: int = 32) -> int:
    """Bytes of the keys and values HF's attention expands from the latent, per token and layer (measured)."""
    attn = model.model.layers[0].self_attn
    config = model.config
    latent = torch.zeros(1, 1, tokens, config.kv_lora_rank)
    k_rot = torch.zeros(1, 1, tokens, config.qk_rope_head_dim)
    keys, values = attn.expand_kv(latent, k_rot)
    return (keys.numel() * keys.element_size() + values.numel() * values.element_size()) // tokens


def latent_bytes_per_token(model, tokenizer) -> int:
    """Bytes a token takes in one layer of the native engine's pool, from the allocated tensor."""
    engine = NativeEngine(model, tokenizer, max_model_len=256)
    engine.generate([[1, 2, 3, 4]], SamplingParams(temperature=0, max_tokens=4))
    pool = engine.pool.cache.data
    layers, blocks, block_size = pool.shape[0], pool.shape[3], pool.shape[4]
    return pool.numel() * pool.element_size() // (layers * blocks * block_size)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--save-dir", default=None, help="write the small model and the tokenizer here")
    parser.add_argument("--save-glm-dir", default=None, help="write a small GLM-4.5 and the tokenizer here")
    args = parser.parse_args(argv)
    tokenizer = build_tiny_tokenizer()
    if args.save_glm_dir:
        save_small_glm(args.save_glm_dir, tokenizer)
    for shape in SHAPES:
        model = build(shape, tokenizer)
        latent, full = latent_bytes_per_token(model, tokenizer), full_kv_bytes_per_token(model)
        print(f"{shape}: latent cache {latent} B/token/layer (measured pool), full K/V {full} B/token/layer "
              f"(measured expand_kv), {full / latent:.1f}x smaller")
        if shape == "small" and args.save_dir:
            model.save_pretrained(args.save_dir)
            tokenizer.save_pretrained(args.save_dir)
    c = DEEPSEEK_V3
    latent = (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * 2
    full = c["num_attention_heads"] * (c["qk_nope_head_dim"] + c["qk_rope_head_dim"] + c["v_head_dim"]) * 2
    print(f"DeepSeek-V3 shape, bf16 (formula): latent {latent} B/token/layer, full K/V {full}, {full / latent:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Tiny random models with a real tokenizer, built in code in seconds.

Tests and users' debugging runs need a causal LM and a tokenizer without a hub. The
tokenizer is a genuine HF fast tokenizer: byte-level BPE trained here on a fixed corpus
(so every string round-trips), with ChatML special tokens and a chat template that
marks assistant turns with ``{% generation %}`` (for assistant-token masks) and, given
``tools``, lists their names in a short system turn (multi-turn tests stay short). The
models are randomly initialised architectures of the native engine's table (Llama, Qwen2/3, Mistral, Phi-3,
Gemma 2/3, Mixtral, Qwen3-MoE) of a few layers, saved
exactly like a real checkpoint (config, safetensors, tokenizer files).
"""

from __future__ import annotations

import string

CHATML_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\ntools:' }}{% for tool in tools %}{{ ' ' + tool['function']['name'] }}"
    "{% endfor %}{{ '<|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}{{ message['content'] + '<|im_end|>' + '\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _training_corpus() -> list[str]:
    """A fixed corpus covering arithmetic, short English and chat markup."""
    words = (
        "the a of to and is what answer final step by think let's question solve compute "
        "sum product difference plus minus times number result reply only user assistant "
        "system you are helpful output after #### boxed equals therefore so first then"
    ).split()
    lines = [" ".join(words[i : i + 7]) for i in range(0, len(words), 3)]
    digits = [f"{a} + {b} = {a + b}" for a in range(0, 100, 7) for b in range(0, 100, 11)]
    digits += [f"{a} * {b} = {a * b}. #### {a * b}" for a in range(12) for b in range(12)]
    return lines * 4 + digits + [string.printable] * 2


def build_tiny_tokenizer(vocab_size: int = 512):
    """Train a byte-level BPE tokenizer and wrap it as a ``PreTrainedTokenizerFast``.

    Deterministic: the same corpus and vocab size give the same vocabulary every time.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.padding_side = "left"
    return fast


TINY_ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral", "phi3", "gemma2", "gemma3_text", "mixtral", "qwen3_moe")
"""Every architecture :func:`tiny_config` builds (the native engine's table, one each)."""

TINY_WINDOW = 8
"""The sliding window of the tiny windowed models: shorter than a chat prompt, so it bites in every test."""


def tiny_config(arch: str = "llama", vocab_size: int = 512, **overrides):
    """Config of a small random causal LM: 2 layers (3 for Gemma: local, global, local), hidden 64, GQA 4/2 heads.

    The Gemma caps and the windows are small so that they change the numbers of a random tiny model (a cap
    of 50 over scores of 0.01 changes nothing a test can see)."""
    import transformers

    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=0,
    )
    gemma_layers = ["sliding_attention", "full_attention", "sliding_attention"]
    gemma = dict(num_hidden_layers=3, layer_types=gemma_layers, sliding_window=TINY_WINDOW, head_dim=16,
                 query_pre_attn_scalar=24)
    extra = {
        "llama": ("LlamaConfig", {}),
        "qwen2": ("Qwen2Config", {}),
        "qwen3": ("Qwen3Config", dict(head_dim=32)),  # like the real ones, heads wider than hidden / heads
        "mistral": ("MistralConfig", dict(sliding_window=TINY_WINDOW)),
        "phi3": ("Phi3Config", dict(tie_word_embeddings=False, sliding_window=TINY_WINDOW)),  # fused qkv / gate_up
        "gemma2": ("Gemma2Config", dict(gemma, attn_logit_softcapping=0.5, final_logit_softcapping=0.3)),
        "gemma3_text": ("Gemma3TextConfig", dict(gemma, rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            "full_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
        "mixtral": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2)),
        "qwen3_moe": ("Qwen3MoeConfig", dict(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                                             mlp_only_layers=[1], norm_topk_prob=False)),
    }
    if arch not in extra:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose one of {', '.join(TINY_ARCHITECTURES)}")
    name, fields = extra[arch]
    return getattr(transformers, name)(**{**common, **fields, **overrides})


def build_tiny_model(arch: str = "llama", seed: int = 0, tokenizer=None, **overrides):
    """Return ``(model, tokenizer)``: a random fp32 causal LM and the tiny tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = tokenizer or build_tiny_tokenizer()
    config = tiny_config(
        arch,
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **overrides,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def save_tiny_model(path: str, arch: str = "llama", seed: int = 0, **overrides) -> str:
    """Build a tiny model and save it like a real checkpoint; returns ``path``."""
    model, tokenizer = build_tiny_model(arch=arch, seed=seed, **overrides)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path

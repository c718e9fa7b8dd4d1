"""Tiny random models with a real tokenizer, built in code in seconds.

Tests and users' debugging runs need a causal LM and a tokenizer without a hub. The
tokenizer is a genuine HF fast tokenizer: byte-level BPE trained here on a fixed corpus
(so every string round-trips), with ChatML special tokens and a chat template that
marks assistant turns with ``{% generation %}`` (for assistant-token masks) and, given
``tools``, lists their names in a short system turn (multi-turn tests stay short). The
models are randomly initialised Llama / Qwen2 / Qwen3 architectures of a few layers, saved
exactly like a real checkpoint (config, safetensors, tokenizer files).
"""

from __future__ import annotations

import argparse
import string
import sys

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


def tiny_config(arch: str = "llama", vocab_size: int = 512, **overrides):
    """Config of a small random causal LM: 2 layers, hidden 64, GQA 4/2 heads."""
    from transformers import LlamaConfig, MistralConfig, Phi3Config, Qwen2Config, Qwen3Config

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
    common.update(overrides)
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "qwen2":
        return Qwen2Config(**common)
    if arch == "qwen3":  # like the real ones, heads wider than hidden / heads (4 x 32 > 64)
        return Qwen3Config(**{"head_dim": 32, **common})
    if arch == "mistral":  # a window as long as the context: the native decoder runs it
        return MistralConfig(**{"sliding_window": common["max_position_embeddings"], **common})
    if arch == "phi3":  # fused qkv_proj and gate_up_proj modules, untied head
        return Phi3Config(**{**common, "tie_word_embeddings": False})
    raise ValueError(f"unknown tiny architecture {arch!r}; choose 'llama', 'qwen2', 'qwen3', 'mistral' or 'phi3'")


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


def main(argv: list[str] | None = None) -> int:
    """``python -m hybridflow.models.tiny DIR [--arch llama|qwen2] [--seed S]`` (also: ``hybridflow models tiny``)."""
    parser = argparse.ArgumentParser(prog="hybridflow models tiny",
                                     description="write a tiny random model (with a real tokenizer) for tests")
    parser.add_argument("dir")
    parser.add_argument("--arch", choices=["llama", "qwen2"], default="llama")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    save_tiny_model(args.dir, arch=args.arch, seed=args.seed)
    print(f"wrote a tiny random {args.arch} model to {args.dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

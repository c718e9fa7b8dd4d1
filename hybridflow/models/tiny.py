"""Tiny random models with a real tokenizer, built in code in seconds.

Tests and users' debugging runs need a causal LM and a tokenizer without a hub. The
tokenizer is a genuine HF fast tokenizer: byte-level BPE trained here on a fixed corpus
(so every string round-trips), with ChatML special tokens and a chat template that
marks assistant turns with ``{% generation %}`` (for assistant-token masks) and, given
``tools``, lists their names in a short system turn (multi-turn tests stay short). The
models are randomly initialised architectures of the native engine's table (Llama, Qwen2/3, Mistral, Phi-3,
Gemma 2/3, Mixtral, Qwen3-MoE, OLMo 2/3, gpt-oss) of a few layers, saved
exactly like a real checkpoint (config, safetensors, tokenizer files).
"""

from __future__ import annotations

import argparse
import dataclasses
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


TINY_ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral", "phi3", "gemma2", "gemma3_text", "mixtral", "qwen3_moe",
                      "olmo2", "olmo3", "gpt_oss")  # issue 58: olmo2, olmo3, gpt_oss
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
        # issue 58: OLMo 2 / 3 (OLMo 3: a local layer then a global one, each with its rotary base), gpt-oss (a
        # local layer then a global one, YaRN over 32 x 4096 positions, a SwiGLU clamp that bites at these sizes)
        "olmo2": ("Olmo2Config", {}),
        "olmo3": ("Olmo3Config", dict(layer_types=["sliding_attention", "full_attention"], sliding_window=TINY_WINDOW,
                                      rope_parameters={
                                          "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                                          "full_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
        "gpt_oss": ("GptOssConfig", dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2, intermediate_size=64,
                                         max_position_embeddings=131072, sliding_window=TINY_WINDOW, swiglu_limit=0.2,
                                         layer_types=["sliding_attention", "full_attention"])),
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
        if arch == "gpt_oss":
            _show_sinks_and_biases(model)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def _show_sinks_and_biases(model) -> None:
    """gpt-oss: HF starts the sinks at std 0.02 and every bias at 0, which would hide a path that drops them; draw
    the sinks with std 1 and the biases with std 0.1 (issue 58)."""
    import torch

    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("sinks"):
                parameter.normal_(0.0, 1.0)
            elif name.endswith("bias"):
                parameter.normal_(0.0, 0.1)


def save_tiny_model(path: str, arch: str = "llama", seed: int = 0, **overrides) -> str:
    """Build a tiny model and save it like a real checkpoint; returns ``path`` (``arch="qwen2_5_vl"`` or
    another of :data:`VL_ARCHS`: the vision-language model of :func:`save_tiny_vl_model`)."""
    if arch in VL_ARCHS:
        return save_tiny_vl_model(path, seed=seed, arch=arch, **overrides)
    model, tokenizer = build_tiny_model(arch=arch, seed=seed, **overrides)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


# ---------------------------------------------------------------- tiny vision-language models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL)
VISION_TOKENS = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"]
"""Qwen2-VL's special tokens: an image is ``<|vision_start|>`` + one ``<|image_pad|>`` per merged patch
(the processor expands the single pad of the template) + ``<|vision_end|>``."""

VL_CHATML_TEMPLATE = CHATML_TEMPLATE.replace(
    "{{ message['content'] + '<|im_end|>' + '\n' }}",
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}{{ '<|im_end|>' + '\n' }}",
)
"""The ChatML template with Qwen2-VL's content lists: an ``{"type": "image"}`` part becomes the image's
placeholder, a ``{"type": "text"}`` part its text (user turns; assistant turns stay plain text)."""


@dataclasses.dataclass(frozen=True)
class TinyVL:
    """What differs between the tiny vision-language models: their transformers classes and the pixels of a
    patch (Qwen2-VL / Qwen2.5-VL: 14, Qwen3-VL: 16; 2x2 patches make one token either way)."""

    processor: str
    config: str
    model: str
    patch_size: int = 14


VL_ARCHS = {
    "qwen2_5_vl": TinyVL("Qwen2_5_VLProcessor", "Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration"),
    "qwen2_vl": TinyVL("Qwen2VLProcessor", "Qwen2VLConfig", "Qwen2VLForConditionalGeneration"),
    "qwen3_vl": TinyVL("Qwen3VLProcessor", "Qwen3VLConfig", "Qwen3VLForConditionalGeneration", patch_size=16),
}


def build_tiny_vl_processor(tokenizer=None, *, arch: str = "qwen2_5_vl", max_pixels: int | None = None):
    """A Qwen-VL processor for images: the tiny tokenizer plus the vision tokens, and Qwen2-VL's image processor
    (the arch's patch size, 2 frames per temporal patch, 2x2 patches merged into one token), images resized to at
    most ``max_pixels`` (default 8 x 8 patches: 112 x 112 pixels for Qwen2.5-VL, 128 x 128 for Qwen3-VL, 16
    tokens)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from hybridflow.models.vision import image_only_processor

    patch = VL_ARCHS[arch].patch_size
    tokenizer = tokenizer or build_tiny_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", *VISION_TOKENS]})
    tokenizer.chat_template = VL_CHATML_TEMPLATE
    image_processor = Qwen2VLImageProcessorPil(min_pixels=(2 * patch) ** 2, max_pixels=max_pixels or (8 * patch) ** 2,
                                               patch_size=patch, temporal_patch_size=2, merge_size=2)
    return image_only_processor(VL_ARCHS[arch].processor, image_processor=image_processor, tokenizer=tokenizer,
                                chat_template=VL_CHATML_TEMPLATE)


def _tiny_vision_config(arch: str, out_hidden_size: int) -> dict:
    """A 2-block vision tower (hidden 32, 2 heads) over the arch's patches that merges 2x2 patches into one token
    of the language model's width (Qwen2.5-VL: windowed attention in block 0, full in block 1; Qwen3-VL: a learned
    8 x 8 position grid, and both blocks' features stacked onto the first two decoder layers: deepstack)."""
    shared = dict(depth=2, num_heads=2, patch_size=VL_ARCHS[arch].patch_size, spatial_merge_size=2,
                  temporal_patch_size=2)
    if arch == "qwen2_vl":
        return dict(shared, embed_dim=32, mlp_ratio=2, hidden_size=out_hidden_size)
    if arch == "qwen3_vl":
        return dict(shared, hidden_size=32, intermediate_size=64, out_hidden_size=out_hidden_size,
                    num_position_embeddings=64, deepstack_visual_indexes=[0, 1])
    return dict(shared, hidden_size=32, intermediate_size=64, out_hidden_size=out_hidden_size, window_size=56,
                fullatt_block_indexes=[1])


def _tiny_rope(arch: str) -> dict:
    """M-RoPE over head_dim 16: sections 2+3+3 of the 8 frequencies for time, height, width (Qwen3-VL interleaves
    them t h w t h w ... instead of three blocks)."""
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}
    return dict(rope, mrope_interleaved=True) if arch == "qwen3_vl" else rope


def tiny_vl_config(tokenizer, *, arch: str = "qwen2_5_vl", vision: dict | None = None, **text_overrides):
    """Config of a small random Qwen2.5-VL (or Qwen2-VL, Qwen3-VL): the tiny text model (2 layers, hidden 64, GQA
    4/2 heads of 16, :func:`_tiny_rope`'s M-RoPE) under :func:`_tiny_vision_config`'s tower, or the tower of
    ``vision`` (the arch's vision config fields; benchmarks/model_shapes.py gives real models' shapes this way, with
    the tokenizer's vision token ids)."""
    import transformers

    ids = dict(zip(VISION_TOKENS, tokenizer.convert_tokens_to_ids(VISION_TOKENS)))
    text = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
                tie_word_embeddings=True, rope_parameters=_tiny_rope(arch),
                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    text.update(text_overrides)
    config_class = getattr(transformers, VL_ARCHS[arch].config)
    return config_class(text_config=text, vision_config=vision or _tiny_vision_config(arch, text["hidden_size"]),
                        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
                        tie_word_embeddings=True)


def build_tiny_vl_model(seed: int = 0, *, arch: str = "qwen2_5_vl", **text_overrides):
    """Return ``(model, processor)``: a random fp32 ``Qwen2_5_VLForConditionalGeneration`` (or the ``arch``'s
    class of :data:`VL_ARCHS`) and its processor (``processor.tokenizer`` is the tokenizer)."""
    import torch
    import transformers

    if arch not in VL_ARCHS:
        raise ValueError(f"unknown tiny vision-language architecture {arch!r}; choose one of {sorted(VL_ARCHS)}")
    processor = build_tiny_vl_processor(arch=arch)
    tokenizer = processor.tokenizer
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model_class = getattr(transformers, VL_ARCHS[arch].model)
        model = model_class(tiny_vl_config(tokenizer, arch=arch, **text_overrides)).float()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, processor


def save_tiny_vl_model(path: str, seed: int = 0, *, arch: str = "qwen2_5_vl", **text_overrides) -> str:
    """Build a tiny Qwen2.5-VL (or Qwen2-VL, Qwen3-VL) and save it like a real checkpoint (config, weights, tokenizer,
    processor)."""
    model, processor = build_tiny_vl_model(seed=seed, arch=arch, **text_overrides)
    model.save_pretrained(path, safe_serialization=True)
    processor.save_pretrained(path)
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m hybridflow.models.tiny DIR [--arch ARCH] [--seed S]`` (also: ``hybridflow models tiny``)."""
    parser = argparse.ArgumentParser(prog="hybridflow models tiny",
                                     description="write a tiny random model (with a real tokenizer) for tests")
    parser.add_argument("dir")
    parser.add_argument("--arch", choices=[*TINY_ARCHITECTURES, *VL_ARCHS], default="llama")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    save_tiny_model(args.dir, arch=args.arch, seed=args.seed)
    # the path alone on stdout, so `MODEL=$(hybridflow models tiny DIR)` gets it; the sentence for people on stderr
    print(f"wrote a tiny random {args.arch} model to {args.dir}", file=sys.stderr)
    print(args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())

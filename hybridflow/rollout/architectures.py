"""The architectures the native decoder runs: one declared table, and why a model falls outside it.

Every entry is a decoder of RMSNorms, rotary embeddings from the model's own module, grouped query
attention and a gated MLP (pre-norm but for OLMo) and says how its HF modules map onto the decoder's fused projections
(``q|k|v``, ``o``, ``gate|up``, ``down``) and what it adds on top of Llama's layer:

- Gemma 2 / Gemma 3 (text): RMSNorm scaling by ``1 + w``, embeddings scaled by ``sqrt(hidden)``, GeGLU
  (``gelu_pytorch_tanh``), a norm after attention and after the MLP as well as before each, attention
  scaled by ``query_pre_attn_scalar ** -0.5``, tanh soft-capping of attention scores and final logits
  (Gemma 2), sliding-window layers alternating with global ones (``config.layer_types``), and for Gemma 3
  q / k norms and a rotary base of its own for the sliding layers.
- Mixtral / Qwen3-MoE: a top-k routed mixture of SwiGLU experts in place of the MLP (:mod:`moe`).
- Mistral / Phi-3 / Mixtral / Qwen2 with ``use_sliding_window``: a sliding attention window.
- DeepSeek-V3 (Kimi-K2, DeepSeek-R1): multi-head latent attention over a cache of compressed latents and a
  sigmoid, group-limited mixture of experts with shared experts, in a decoder of its own (:mod:`mla`).
- GLM-4.5: partial rotary, optional q / k norms, and DeepSeek-V3's mixture of experts (:mod:`grouped_moe`).
- Qwen2-VL / Qwen2.5-VL / Qwen3-VL: the language model of a vision-language model (Qwen2's / Qwen3's layer) with
  M-RoPE positions and the vision tower's output in the prefill (:mod:`hybridflow.rollout.vision_prefill`).
- OLMo 2 / OLMo 3 (issue 58): no norm before a sub-block, a norm of each sub-block's output before the residual
  add, q / k RMSNorms over the whole projections (before the split into heads); OLMo 3 adds sliding-window layers
  (``config.layer_types``) with a rotary base per layer type.
- gpt-oss (issue 58): attention sinks (a learned logit per head in every softmax), alternating sliding / full
  layers, q/k/v/o biases, YaRN rotary tables of half the head size, and its mixture of experts (router with a
  bias, softmax over the k selected logits, experts with biases and the clamped SwiGLU, :mod:`moe`).

A model whose type is here but whose config asks for something the decoder does not compute is refused
by :func:`unsupported_reason`, and ``build_engine("native", ...)`` then runs it through HF ``generate``
saying why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LLAMA_PROJECTIONS = {
    "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "o_proj": ("self_attn.o_proj",),
    "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "down": ("mlp.down_proj",),
}
"""Each fused projection of a layer and the HF linear modules (under ``model.layers.{i}``) it stacks, in order."""

ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
"""The gate activations the decoder computes: SwiGLU and GeGLU with the tanh approximation."""


@dataclass(frozen=True)
class Architecture:
    """What the native decoder needs to know of one HF ``model_type``."""

    projections: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(LLAMA_PROJECTIONS))
    """Fused projection -> the HF modules it stacks (a module already fused in HF maps alone)."""
    qk_norm: bool = False
    """An RMSNorm over each query and key head before the rotation (Qwen3's and Gemma 3's ``q_norm`` / ``k_norm``)."""
    gemma_norms: bool = False
    """Gemma: every RMSNorm scales by ``1 + w`` in fp32 before the cast, and each sub-block has a second norm
    on its output (``post_attention_layernorm`` after attention, ``pre_feedforward_layernorm`` before the MLP,
    ``post_feedforward_layernorm`` after it)."""
    rope_per_layer_type: bool = False
    """Gemma 3: the rotary module takes the layer type (sliding layers rotate with their own base)."""
    moe_renormalize: str | None = None
    """Mixture of experts: ``"always"`` (Mixtral: the top-k routing weights are renormalised to sum to 1) or
    ``"norm_topk_prob"`` (Qwen3-MoE: only where the config says so), ``"top_k_logits"`` (gpt-oss: the softmax runs
    over the k selected logits of a router with a bias; experts with biases and the clamped SwiGLU); None for a
    dense MLP."""
    # Issue 58 (DeepSeek-V3 / GLM-4.5):
    attention: str = "gqa"
    """``"gqa"``: the decoder's grouped-query attention over keys and values; ``"mla"``: DeepSeek's multi-head latent
    attention over a cache of compressed latents (:mod:`hybridflow.rollout.mla`, its own decoder)."""
    partial_rotary: bool = False
    """GLM-4.5: the rotary embedding turns only the first ``partial_rotary_factor`` of each head's dimensions."""
    # issue 58 (OLMo 2 / 3, gpt-oss):
    pre_norms: bool = True
    """False: OLMo 2 / 3 normalise nothing before attention or the MLP; their ``post_attention_layernorm`` /
    ``post_feedforward_layernorm`` normalise each sub-block's output before the residual add."""
    qk_norm_whole: bool = False
    """OLMo 2 / 3: ``q_norm`` / ``k_norm`` are RMSNorms over the whole q (``H * D``) and k (``KV * D``) projections,
    before the split into heads (Qwen3's normalise each head)."""
    norm_scale_fp32: bool = False
    """OLMo 2 / 3, gpt-oss: an RMSNorm's weight multiplies the fp32 normalised value and the product is cast (Llama
    casts first); the same in fp32."""
    attention_sinks: bool = False
    """gpt-oss: one learned logit per head (``self_attn.sinks``) joins every query's softmax and is dropped after."""
    half_rope_tables: bool = False
    """gpt-oss: the rotary module's tables cover half a head (its rotation pairs the two halves); the decoder repeats
    them into the rotate-half form."""


GEMMA = Architecture(qk_norm=False, gemma_norms=True)
ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture(),
    "mistral": Architecture(),  # Llama's layer with a sliding window
    "qwen2": Architecture(),  # q/k/v biases (taken from the modules)
    "qwen3": Architecture(qk_norm=True),
    "phi3": Architecture(projections={  # HF already fuses q|k|v and gate|up, in the decoder's order
        "qkv": ("self_attn.qkv_proj",), "o_proj": ("self_attn.o_proj",),
        "gate_up": ("mlp.gate_up_proj",), "down": ("mlp.down_proj",)}, qk_norm=False),
    "gemma2": GEMMA,
    "gemma3_text": Architecture(qk_norm=True, gemma_norms=True, rope_per_layer_type=True),
    "mixtral": Architecture(moe_renormalize="always"),
    "qwen3_moe": Architecture(qk_norm=True, moe_renormalize="norm_topk_prob"),
    # Vision-language: the language model under the vision tower (:mod:`hybridflow.rollout.vision_prefill`).
    "qwen2_vl": Architecture(),  # Qwen2's layer, M-RoPE
    "qwen2_5_vl": Architecture(),
    "qwen3_vl": Architecture(qk_norm=True),  # Qwen3's layer, interleaved M-RoPE, deepstack features
    # Issue 58: DeepSeek-V3 (Kimi-K2 and DeepSeek-R1 share the model_type): latent attention, sigmoid group-limited
    # routing with shared experts, dense first layers (:mod:`hybridflow.rollout.mla`, :mod:`~.grouped_moe`).
    "deepseek_v3": Architecture(projections={}, attention="mla"),
    # GLM-4.5 / 4.6 / 4.7 (glm4_moe): Llama's attention (q/k/v biases, optional q / k norms) with partial rotary, and
    # DeepSeek-V3's routing and shared experts after dense first layers (:mod:`~.grouped_moe`).
    "glm4_moe": Architecture(partial_rotary=True),
    # issue 58: OLMo 2 / 3 (post-norm, whole-projection q / k norms; OLMo 3: sliding layers) and gpt-oss.
    "olmo2": Architecture(pre_norms=False, qk_norm_whole=True, norm_scale_fp32=True),
    "olmo3": Architecture(pre_norms=False, qk_norm_whole=True, norm_scale_fp32=True, rope_per_layer_type=True),
    "gpt_oss": Architecture(norm_scale_fp32=True, attention_sinks=True, half_rope_tables=True,
                            moe_renormalize="top_k_logits"),
}


def sliding_window(config) -> int | None:
    """The attention window the config applies, or None: Qwen2/3 only with ``use_sliding_window``,
    the others whenever ``sliding_window`` is set."""
    window = getattr(config, "sliding_window", None)
    if hasattr(config, "use_sliding_window") and not config.use_sliding_window:
        return None
    return window


def layer_windows(config) -> list[int | None]:
    """Each layer's attention window ``W`` (query ``i`` sees keys ``i - W < j <= i``), None for global
    attention: the layers ``config.layer_types`` marks ``sliding_attention`` where it lists them, else
    every layer."""
    window = sliding_window(config)
    layer_types = getattr(config, "layer_types", None)
    if window is None:
        return [None] * config.num_hidden_layers
    if layer_types is None:
        return [window] * config.num_hidden_layers
    return [window if kind == "sliding_attention" else None for kind in layer_types]


def hidden_activation(config) -> str:
    """The MLP gate's activation name (Gemma calls it ``hidden_activation``)."""
    return getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")


def unsupported_reason(config, *, max_model_len: int | None = None) -> str | None:
    """None where the native decoder reproduces this model exactly, else why not, in one phrase.
    (``max_model_len`` is accepted for callers that size the context; every window is computed.) A
    vision-language config is judged by its language model's config."""
    if config.model_type not in ARCHITECTURES:
        return (f"model_type {config.model_type!r} is not in hybridflow.rollout.architectures.ARCHITECTURES "
                f"{sorted(ARCHITECTURES)}")
    architecture = ARCHITECTURES[config.model_type]
    config = config.get_text_config()
    activation = hidden_activation(config)
    checks = (
        (activation not in ACTIVATIONS,
         f"hidden_act={activation!r} (the decoder runs gated MLPs with {' or '.join(ACTIVATIONS)})"),
        (getattr(config, "pretraining_tp", 1) != 1, "pretraining_tp > 1"),
        (getattr(config, "partial_rotary_factor", 1.0) != 1.0 and not architecture.partial_rotary,
         f"a partial rotary embedding (partial_rotary_factor={getattr(config, 'partial_rotary_factor', None)})"),
        (getattr(config, "use_bidirectional_attention", False),
         "use_bidirectional_attention (the decoder attends causally)"),
    )
    return next((reason for failed, reason in checks if failed), None)

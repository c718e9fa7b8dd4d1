"""The architectures the native decoder runs: one declared table, and why a model falls outside it.

Every entry is a Llama-shaped decoder (RMSNorm, rotary embeddings from the model's own module, grouped
query attention, SwiGLU) and says only how its HF modules map onto the decoder's four fused projections
(``q|k|v``, ``o``, ``gate|up``, ``down``) and what it adds. A model whose type is here but whose config
asks for something the decoder does not compute is refused by :func:`unsupported_reason`, and
``build_engine("native", ...)`` then runs it through HF ``generate`` saying why.
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


@dataclass(frozen=True)
class Architecture:
    """What the native decoder needs to know of one HF ``model_type``."""

    projections: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(LLAMA_PROJECTIONS))
    """Fused projection -> the HF modules it stacks (a module already fused in HF maps alone)."""
    qk_norm: bool = False
    """An RMSNorm over each query and key head before the rotation (Qwen3's ``q_norm`` / ``k_norm``)."""


ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture(),
    "mistral": Architecture(),  # Llama's layer; its sliding window only where the context fits in it
    "qwen2": Architecture(),  # q/k/v biases (taken from the modules)
    "qwen3": Architecture(qk_norm=True),
    "phi3": Architecture(projections={  # HF already fuses q|k|v and gate|up, in the decoder's order
        "qkv": ("self_attn.qkv_proj",), "o_proj": ("self_attn.o_proj",),
        "gate_up": ("mlp.gate_up_proj",), "down": ("mlp.down_proj",)}, qk_norm=False),
}


def sliding_window(config) -> int | None:
    """The attention window the config applies, or None: Qwen2/3 only with ``use_sliding_window``,
    Mistral and Phi-3 whenever ``sliding_window`` is set."""
    window = getattr(config, "sliding_window", None)
    if hasattr(config, "use_sliding_window") and not config.use_sliding_window:
        return None
    return window


def unsupported_reason(config, *, max_model_len: int | None = None) -> str | None:
    """None where the native decoder reproduces this model exactly for contexts of ``max_model_len``
    positions (default: the config's ``max_position_embeddings``), else why not, in one phrase."""
    if config.model_type not in ARCHITECTURES:
        return (f"model_type {config.model_type!r} is not in hybridflow.rollout.architectures.ARCHITECTURES "
                f"{sorted(ARCHITECTURES)}")
    context = max_model_len or getattr(config, "max_position_embeddings", None)
    window = sliding_window(config)
    checks = (
        (getattr(config, "hidden_act", "silu") != "silu",
         f"hidden_act={getattr(config, 'hidden_act', None)!r} (the decoder runs SwiGLU with silu)"),
        (getattr(config, "pretraining_tp", 1) != 1, "pretraining_tp > 1"),
        (getattr(config, "partial_rotary_factor", 1.0) != 1.0,
         f"a partial rotary embedding (partial_rotary_factor={getattr(config, 'partial_rotary_factor', None)})"),
        (window is not None and (context is None or context > window),
         f"a sliding window of {window} positions shorter than the context ({context}); set max_model_len "
         f"(rollout.prompt_length + response_length) to at most {window} to run it natively"),
    )
    return next((reason for failed, reason in checks if failed), None)

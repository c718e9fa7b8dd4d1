"""verl's ``actor_rollout_ref.model.*``: the policy model (path, LoRA, remove padding, checkpointing of activations).

Part of the PPO trainer's schema (:class:`hybridflow.config.ppo.PPOConfig`); each field's docstring is its
documentation, and ``ppo_trainer.yaml`` is generated from them.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from omegaconf import MISSING


@dataclass
class ModelConfig:
    """The policy model (verl's ``actor_rollout_ref.model.*``)."""

    path: str = MISSING
    """Local HF folder or hub id of the model to train (``hybridflow models tiny DIR`` makes a test model)."""
    custom_chat_template: Optional[str] = None
    """A Jinja chat template that replaces the tokenizer's."""
    external_lib: Optional[str] = None
    """Python module to import before loading (registers custom architectures)."""
    override_config: Dict[str, Any] = field(default_factory=dict)
    """Entries that override the model's HF config (e.g. attn_implementation, dropout)."""
    enable_gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory (verl defaults to true; off is faster on CPU)."""
    enable_activation_offload: bool = False
    """Compatibility-only, no effect (see compat.py)."""
    use_remove_padding: bool = False
    """Padding-free forwards for the actor update and the old / reference log-prob passes: the
    valid tokens of a micro-batch go through the model as one packed row, attention kept inside
    each sequence. Same log-probs and gradients as the padded layout (within fp32 rounding)."""
    use_shared_prompt: bool = True
    """hybridflow extension (implies use_remove_padding), on by default: the rollout.n responses of a
    prompt share one copy of its tokens in the packed row (each response attends to the prompt and to
    itself), so the prompt is computed once per group in the forward and the backward. Same gradients
    as the padded layout within fp32 rounding; a model whose attention does not go through transformers'
    attention interface falls back to the padded layout with one warning. False (and use_remove_padding
    False) chooses the padded layout."""
    # verl 0.9.1's model paths
    tokenizer_path: Optional[str] = None
    """The tokenizer's folder; null: the model's (``data.tokenizer`` wins when set)."""
    hf_config_path: Optional[str] = None
    """The HF config's folder (architecture, sizes); null: the model's. The weights still come from ``path``."""
    lora_adapter_path: Optional[str] = None
    """A trained LoRA adapter (a peft folder) to continue from: the actor trains it, the reference is the model with
    the adapter off, rollouts start from the merged weights; lora_rank / lora_alpha / target_modules come from
    the adapter."""
    lora_rank: int = 0
    """LoRA rank; 0 trains the full model."""
    lora_alpha: int = 16
    """LoRA scaling numerator (scale = alpha / rank)."""
    target_modules: Any = "all-linear"
    """Modules that get LoRA adapters: ``all-linear`` or a list of module names."""
    exclude_modules: Optional[Any] = None
    """Modules excluded from LoRA."""
    use_liger: bool = False
    """Compatibility-only, no effect (see compat.py)."""
    use_fused_kernels: bool = False
    """Log-probs and entropy (actor, reference, old log-probs) from the final hidden states and the LM
    head's weight in chunks of tokens, never the ``[tokens, vocab]`` logits; backward recomputes each
    chunk (``hybridflow/algos/linear_logprob.py``). Same values; a head that is not a bias-free linear
    layer falls back to the logits with one warning. ``use_torch_compile`` / ``entropy_checkpointing``
    apply to the logits path only (the chunked one always recomputes)."""
    trust_remote_code: bool = False
    """Allow models with custom code."""
    use_shm: bool = False
    """Compatibility-only (compat.py): verl copies the model to /dev/shm before loading."""
    dtype: Optional[str] = None
    """Compute dtype of actor and reference (mixed precision: ``bf16`` or ``fp16``; weights stay in
    ``fsdp_config.model_dtype``); ``fsdp_config.mixed_precision`` wins when set; null = its default (bf16 on a GPU
    and on a CPU with bf16 units, else the weights' dtype)."""
    attn_implementation: Optional[str] = None
    """HF attention implementation (``eager``, ``sdpa``, ``flash_attention_2``); null = transformers' default."""

"""Config sections shared by the PPO and SFT trainers (optimizer, FSDP, checkpoint, LoRA).

Every field carries a docstring right under it: ``hybridflow config show --doc`` and the
generated YAML files print them, and unknown-key errors suggest the nearest field.
"""

from dataclasses import dataclass, field
from typing import Any, List, Optional


@dataclass
class OptimConfig:
    """AdamW optimizer and learning-rate schedule (verl's ``*.optim``)."""

    lr: float = 1e-6
    """Peak learning rate."""
    lr_warmup_steps: int = -1
    """Linear warm-up steps; -1 derives them from ``lr_warmup_steps_ratio``."""
    lr_warmup_steps_ratio: float = 0.0
    """Warm-up length as a fraction of the total training steps (used when lr_warmup_steps < 0)."""
    min_lr_ratio: Optional[float] = 0.0
    """Floor of the cosine schedule as a fraction of ``lr``."""
    num_cycles: float = 0.5
    """Cosine cycles over training (0.5 = one half-cosine from lr down to the floor)."""
    warmup_style: str = "constant"
    """Schedule after warm-up: ``constant`` or ``cosine`` (verl's name; ``lr_scheduler_type`` is an alias)."""
    lr_scheduler_type: Optional[str] = None
    """Alias of ``warmup_style`` used by newer verl versions; wins when set."""
    total_training_steps: int = -1
    """Filled in by the trainer from the dataset size and epochs; leave at -1."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay."""
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW (beta1, beta2)."""
    eps: float = 1e-8
    """AdamW epsilon."""


@dataclass
class WrapPolicyConfig:
    """Which modules FSDP2 shards as separate units."""

    min_num_params: int = 0
    """Shard every decoder layer (0) or only modules with at least this many parameters."""


@dataclass
class FSDPConfig:
    """FSDP2 (``fully_shard``) settings of one model (verl's ``fsdp_config``)."""

    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)
    """Sharding granularity."""
    param_offload: bool = False
    """Keep parameters on the CPU between uses (CPUOffloadPolicy)."""
    optimizer_offload: bool = False
    """Keep optimizer state on the CPU."""
    offload_policy: bool = False
    """verl's switch for FSDP2's CPUOffloadPolicy (params, grads and optimizer on CPU)."""
    reshard_after_forward: bool = True
    """Free gathered parameters after forward (ZeRO-3); False keeps them until backward (ZeRO-2-like)."""
    fsdp_size: int = -1
    """Shard group size; -1 shards across the whole worker group."""
    forward_prefetch: bool = False
    """Prefetch the next unit's parameters during forward."""
    model_dtype: str = "fp32"
    """Dtype the parameters are held in for training (``fp32`` on CPU; mixed precision on GPU)."""
    mixed_precision: Optional[str] = None
    """Compute dtype on GPU: ``bf16`` (params cast per layer, fp32 reduce) or null for the model dtype."""


@dataclass
class CheckpointContentsConfig:
    """What a checkpoint holds."""

    save_contents: List[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    """Any of ``model``, ``optimizer``, ``extra`` (LR scheduler + RNG), ``hf_model`` (a full HF folder)."""
    load_contents: Optional[List[str]] = None
    """What to restore on resume; null means the same as save_contents."""
    async_save: bool = False
    """Accepted for verl compatibility; saving is synchronous."""

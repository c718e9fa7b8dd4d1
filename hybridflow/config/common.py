"""Config sections shared by the PPO and SFT trainers (optimizer, FSDP, checkpoint, LoRA).

Every field carries a docstring right under it: ``hybridflow config show --doc`` and the
generated YAML files print them, and unknown-key errors suggest the nearest field.
"""

import importlib
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


@dataclass
class OptimConfig:
    """AdamW optimizer and learning-rate schedule (verl's ``*.optim``)."""

    lr: float = 1e-6
    """Peak learning rate."""
    lr_warmup_steps: Optional[int] = -1
    """Linear warm-up steps (the lr rises as step / lr_warmup_steps from 0, verl's schedule); null, 0 or negative
    derives them from ``lr_warmup_steps_ratio``."""
    lr_warmup_steps_ratio: float = 0.0
    """Warm-up length as a fraction of the total training steps (used when lr_warmup_steps is not positive)."""
    min_lr_ratio: Optional[float] = 0.0
    """Floor of the cosine schedule as a fraction of ``lr``."""
    num_cycles: float = 0.5
    """Cosine cycles over training (0.5 = one half-cosine from lr down to the floor)."""
    lr_scheduler_type: str = "constant"
    """Schedule after warm-up: ``constant`` or ``cosine``."""
    warmup_style: Optional[str] = None
    """verl's deprecated name of ``lr_scheduler_type``; when set it wins, as in verl 0.9."""
    zero_indexed_step: bool = True
    """False counts the cosine schedule's steps from 1 instead of 0 (torchtitan's convention; verl applies it to
    the cosine schedule only)."""
    clip_grad: float = 1.0
    """Clip the global gradient norm to this value before each step (verl 0.9's key; must be > 0)."""
    grad_clip: Optional[float] = None
    """verl 0.9's deprecated name of ``clip_grad`` inside ``optim``; when set it wins, as in verl 0.9."""
    total_training_steps: int = -1
    """Compatibility-only (compat.py); in verl: filled in by the trainer from the dataset size and epochs; leave at -1."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay."""
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW (beta1, beta2)."""
    eps: float = 1e-8
    """AdamW epsilon."""
    # verl 0.9.1's choice of optimizer class
    optimizer: str = "AdamW"
    """Optimizer class name inside ``optimizer_impl`` (verl 0.9.1: e.g. AdamW, AdamW8bit, _AdamW)."""
    optimizer_impl: str = "torch.optim"
    """Module the optimizer class is imported from (torch.optim, torchao.optim, bitsandbytes.optim, ...)."""
    override_optimizer_config: Optional[Dict[str, Any]] = field(default_factory=dict)
    """Extra keyword arguments of the optimizer class, over lr / weight_decay / betas (as verl 0.9.1; its null is
    the empty mapping)."""
    skip_zero_grad_steps: bool = False
    """Skip the optimizer step when the gradient is exactly zero (e.g. every GRPO group scored alike, no KL or
    entropy term): AdamW would otherwise still move every weight by its momentum and weight decay, replaying the
    last real update with no new signal. The schedule still advances (``actor/grad_norm`` is 0 on such steps)."""


@dataclass
class WrapPolicyConfig:
    """Which modules FSDP2 shards as separate units."""

    min_num_params: int = 0
    """Compatibility-only (compat.py); in verl: shard every decoder layer (0) or only modules with at least this many parameters."""
    transformer_layer_cls_to_wrap: list[str] | None = None
    """Class names of the modules sharded one by one (e.g. ``[Qwen2DecoderLayer]``); null: the model's own
    ``_no_split_modules`` (its decoder-layer class, whatever the architecture), as in verl."""


@dataclass
class FSDPConfig:
    """FSDP2 (``fully_shard``) settings of one model (verl's ``fsdp_config``)."""

    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)
    """Sharding granularity."""
    param_offload: bool = False
    """Keep sharded parameters, gradients and optimizer state on the CPU between uses (FSDP2's
    CPUOffloadPolicy; pinned memory only with CUDA). Applies when the model is sharded (world size > 1); with one
    training process the model is not sharded, its parameters stay on the device, and a warning says so once (verl
    shards even there)."""
    optimizer_offload: bool = False
    """Keep the optimizer state in CPU memory between steps; it visits the parameters' device for the update."""
    offload_policy: bool = False
    """verl's switch for FSDP2's CPUOffloadPolicy (params, grads and optimizer on CPU)."""
    reshard_after_forward: bool = True
    """Free gathered parameters after forward (ZeRO-3); False keeps them until backward (ZeRO-2-like)."""
    fsdp_size: int = -1
    """Shard group size: parameters are sharded inside groups of this many ranks and replicated across
    groups (HSDP, a 2-D mesh); -1 (or >= world size) shards across the whole worker group."""
    forward_prefetch: bool = False
    """Compatibility-only (compat.py); in verl: prefetch the next unit's parameters during forward."""
    model_dtype: str = "fp32"
    """Dtype the trained parameters (and optimizer state) are held in: ``fp32``, ``bf16`` or ``fp16``."""
    mixed_precision: Any = None
    """Compute precision over the ``model_dtype`` weights (FSDP2 casts per layer; autocast on a single process).
    verl's mapping ``{param_dtype, reduce_dtype, buffer_dtype}``: param_dtype (default ``bf16``) is the compute
    dtype, reduce_dtype (``fp32``) the gradient reduction's, buffer_dtype is not applied (FSDP2 casts parameters
    only). A dtype name (``bf16``, ``fp16``, ``fp32``) sets the compute dtype. null: bf16 on a GPU, as verl, and on a
    CPU with AVX-512-BF16 / AMX; fp32 on other CPUs, where bf16 matmuls are 27-160x slower (docs/configuration.md);
    the choice is said in one line at start-up (``HYBRIDFLOW_CPU_BF16=0/1`` overrides the CPU detection)."""


@dataclass
class CheckpointContentsConfig:
    """What a checkpoint holds."""

    save_contents: List[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    """Any of ``model``, ``optimizer``, ``extra`` (LR scheduler + RNG), ``hf_model`` (a full HF folder)."""
    load_contents: Optional[List[str]] = None
    """What to restore on resume; null means the same as save_contents."""
    async_save: bool = False
    """Compatibility-only, no effect (see compat.py)."""


LR_SCHEDULES = ("constant", "cosine")


def _optimizer_class_problems(key: str, optim: Any) -> list[str]:
    """``optim.optimizer`` must name a class in an importable ``optim.optimizer_impl``."""
    impl, name = getattr(optim, "optimizer_impl", "torch.optim"), getattr(optim, "optimizer", "AdamW")
    try:
        module = importlib.import_module(impl)
    except ImportError:
        return [f"{key}.optimizer_impl={impl!r} cannot be imported: install it or use torch.optim"]
    if not isinstance(getattr(module, name, None), type):
        return [f"{key}.optimizer={name!r} is not a class in {impl} (e.g. AdamW, SGD)"]
    return []


def optim_problems(key: str, optim: Any) -> list[str]:
    """AdamW and schedule settings that torch would only reject after the model has loaded (a NaN or infinite
    learning rate it takes silently, and every weight becomes NaN at the first step)."""
    problems: list[str] = []
    if not 0 <= optim.lr < math.inf:
        problems.append(f"{key}.lr={optim.lr} must be a finite number >= 0 (a typical RL learning rate is 1e-6)")
    if optim.eps < 0:
        problems.append(f"{key}.eps={optim.eps} must be >= 0 (AdamW's default is 1e-8)")
    if optim.weight_decay < 0:
        problems.append(f"{key}.weight_decay={optim.weight_decay} must be >= 0")
    problems.extend(_optimizer_class_problems(key, optim))
    betas = list(optim.betas)
    if len(betas) != 2 or not all(0 <= beta < 1 for beta in betas):
        problems.append(f"{key}.betas={betas} must be two numbers in [0, 1), e.g. [0.9, 0.999]")
    for name in ("lr_warmup_steps_ratio", "warmup_steps_ratio", "min_lr_ratio"):
        value = getattr(optim, name, None)
        if value is not None and not 0 <= value <= 1:
            problems.append(f"{key}.{name}={value} must be in [0, 1]")
    if getattr(optim, "num_cycles", 0) < 0:
        problems.append(f"{key}.num_cycles={optim.num_cycles} must be >= 0")
    if getattr(optim, "clip_grad", 1.0) <= 0:
        problems.append(f"{key}.clip_grad={optim.clip_grad} must be > 0")
    for name in ("lr_scheduler_type", "warmup_style"):
        value = getattr(optim, name, None)
        if value is not None and value not in LR_SCHEDULES:
            problems.append(f"{key}.{name}={value!r} is not one of {', '.join(LR_SCHEDULES)}")
    return problems

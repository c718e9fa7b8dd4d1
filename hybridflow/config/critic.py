"""verl's ``critic.*``: the value model and its update.

Part of the PPO trainer's schema (:class:`hybridflow.config.ppo.PPOConfig`); each field's docstring is its
documentation, and ``ppo_trainer.yaml`` is generated from them.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from omegaconf import II

from hybridflow.config.common import CheckpointContentsConfig, FSDPConfig, OptimConfig


@dataclass
class CriticModelConfig:
    """The value model: a causal-LM backbone with a scalar head."""

    path: Optional[str] = II("actor_rollout_ref.model.path")
    """Model to initialise the critic from; follows the actor's model."""
    tokenizer_path: Optional[str] = II("actor_rollout_ref.model.path")
    """Tokenizer; follows the actor's model."""
    override_config: Dict[str, Any] = field(default_factory=dict)
    """Entries that override the model's HF config."""
    external_lib: Optional[str] = None
    """Python module to import before loading."""
    trust_remote_code: bool = False
    """Allow models with custom code."""
    enable_gradient_checkpointing: bool = False
    """Recompute activations in backward."""
    enable_activation_offload: bool = False
    """Compatibility-only, no effect (see compat.py)."""
    use_remove_padding: bool = False
    """Padding-free value forwards (one packed row per micro-batch); same values and gradients."""
    use_shared_prompt: bool = True
    """hybridflow extension (implies use_remove_padding), on by default: the responses of a prompt share
    its tokens; False (and use_remove_padding False) chooses the padded layout."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 settings."""
    lora_rank: int = 0
    """Compatibility-only (compat.py); in verl: LoRA rank of the critic; 0 = full."""
    lora_alpha: int = 16
    """Compatibility-only (compat.py); in verl: LoRA alpha of the critic."""
    target_modules: Any = "all-linear"
    """Compatibility-only (compat.py); in verl: LoRA target modules of the critic."""
    use_shm: bool = False
    """Compatibility-only, no effect (see compat.py)."""
    # verl 0.9.1's critic model keys (issue 60)
    hf_config_path: Optional[str] = None
    """The HF config's folder (architecture, sizes); null: the critic model's. The weights still come from path."""
    custom_chat_template: Optional[str] = None
    """Compatibility-only (compat.py); in verl: the critic tokenizer's chat template."""
    exclude_modules: Optional[Any] = None
    """Compatibility-only (compat.py); in verl: modules excluded from the critic's LoRA."""
    use_liger: bool = False
    """Compatibility-only (compat.py); in verl: Liger kernels in the critic."""


@dataclass
class CriticConfig:
    """The critic (verl's ``critic.*``), used when ``algorithm.adv_estimator=gae``."""

    enable: Optional[bool] = None
    """Force the critic on/off; null = on exactly when adv_estimator is gae."""
    rollout_n: int = II("actor_rollout_ref.rollout.n")
    """Follows rollout.n."""
    strategy: str = "fsdp"
    """Compatibility-only (compat.py); in verl: training backend."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5, min_lr_ratio=None))
    """Optimizer of the value model."""
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    """The value model."""
    ppo_mini_batch_size: int = II("actor_rollout_ref.actor.ppo_mini_batch_size")
    """Prompts per critic optimizer step; follows the actor."""
    ppo_micro_batch_size: Optional[int] = None
    """Deprecated; use ppo_micro_batch_size_per_gpu."""
    ppo_micro_batch_size_per_gpu: Optional[int] = None
    """Sequences per critic forward/backward on each worker; null = the whole mini-batch shard."""
    forward_micro_batch_size: Optional[int] = None
    """Deprecated; use forward_micro_batch_size_per_gpu."""
    forward_micro_batch_size_per_gpu: Optional[int] = None
    """Sequences per value forward; null = all at once."""
    use_dynamic_bsz: bool = II("actor_rollout_ref.actor.use_dynamic_bsz")
    """Token-budget micro-batches."""
    ppo_max_token_len_per_gpu: int = 32768
    """Token budget of one training micro-batch when use_dynamic_bsz."""
    forward_max_token_len_per_gpu: int = 32768
    """Token budget of one forward micro-batch when use_dynamic_bsz."""
    ppo_epochs: int = II("actor_rollout_ref.actor.ppo_epochs")
    """Passes over each batch; follows the actor."""
    shuffle: bool = II("actor_rollout_ref.actor.shuffle")
    """Shuffle between mini-batches; follows the actor."""
    cliprange_value: float = 0.5
    """Value clipping range around the old values."""
    loss_agg_mode: str = II("actor_rollout_ref.actor.loss_agg_mode")
    """Aggregation of the value loss; follows the actor."""
    loss_scale_factor: Optional[float] = II("actor_rollout_ref.actor.loss_scale_factor")
    """seq-mean-token-sum-norm divisor of the value loss; follows the actor (null = data.max_response_length)."""
    grad_clip: Optional[float] = None
    """verl before 0.9's clip threshold of the critic (verl 0.9 clips at ``critic.optim.clip_grad``); as
    ``actor_rollout_ref.actor.grad_clip``."""
    ulysses_sequence_parallel_size: int = 1
    """Ulysses sequence parallelism of the critic's group (as actor.ulysses_sequence_parallel_size);
    needs critic.model.use_remove_padding."""
    checkpoint: CheckpointContentsConfig = field(default_factory=CheckpointContentsConfig)
    """What critic checkpoints hold."""
    profiler: Dict[str, Any] = field(default_factory=dict)
    """Compatibility-only (compat.py); in verl: this role's nsys / torch profiler settings."""

"""The PPO / GRPO trainer's config: verl's keys, meanings and (where sensible) defaults.

The schema is split by role as verl splits it: :mod:`~hybridflow.config.data`, :mod:`~hybridflow.config.model`,
:mod:`~hybridflow.config.actor`, :mod:`~hybridflow.config.rollout`, :mod:`~hybridflow.config.critic`,
:mod:`~hybridflow.config.reward`, :mod:`~hybridflow.config.algorithm`, :mod:`~hybridflow.config.trainer`; this
module composes them (:class:`PPOConfig`) and re-exports every section's class. Together they are the single source
of truth: ``hybridflow/config/ppo_trainer.yaml`` is generated from them (``hybridflow config dump ppo``) and a test
keeps the two equal. Fields written ``II("...")`` are interpolations resolved after overrides, as in verl.
"""

from dataclasses import dataclass, field
from typing import Any, Dict

from hybridflow.config.distillation import DistillationConfig
from hybridflow.config.data import CustomClassConfig, SamplerConfig, DataConfig
from hybridflow.config.model import ModelConfig
from hybridflow.config.actor import PolicyLossConfig, ActorConfig, RefConfig
from hybridflow.config.rollout import SamplingConfig, MultiTurnConfig, AgentLoopConfig, RolloutConfig
from hybridflow.config.critic import CriticModelConfig, CriticConfig
from hybridflow.config.reward import (PRMOptimConfig, RewardModelModelConfig, SandboxConfig, OverlongBufferConfig,
                                      RewardRolloutConfig, JudgeConfig, RewardModelConfig, CustomRewardFunctionConfig)
from hybridflow.config.algorithm import (KLControlConfig, FilterGroupsConfig, PFPPOConfig, RolloutCorrectionConfig,
                                         AlgorithmConfig)
from hybridflow.config.trainer import (TrainerConfig, RayInitConfig, RayKwargsConfig, AsyncTrainingConfig,
                                       AsyncRolloutConfig)

__all__ = [
    "CustomClassConfig",
    "SamplerConfig",
    "DataConfig",
    "ModelConfig",
    "PolicyLossConfig",
    "ActorConfig",
    "RefConfig",
    "SamplingConfig",
    "MultiTurnConfig",
    "AgentLoopConfig",
    "RolloutConfig",
    "ActorRolloutRefConfig",
    "CriticModelConfig",
    "CriticConfig",
    "PRMOptimConfig",
    "RewardModelModelConfig",
    "SandboxConfig",
    "OverlongBufferConfig",
    "RewardRolloutConfig",
    "JudgeConfig",
    "RewardModelConfig",
    "CustomRewardFunctionConfig",
    "KLControlConfig",
    "FilterGroupsConfig",
    "PFPPOConfig",
    "RolloutCorrectionConfig",
    "AlgorithmConfig",
    "TrainerConfig",
    "RayInitConfig",
    "RayKwargsConfig",
    "AsyncTrainingConfig",
    "AsyncRolloutConfig",
    "PPOConfig",
    "CheckpointContentsConfig",
    "FSDPConfig",
    "OptimConfig",
]


@dataclass
class ActorRolloutRefConfig:
    """Actor, rollout and reference: colocated in one worker group by default (the hybrid engine)."""

    hybrid_engine: bool = True
    """Compatibility-only (compat.py); in verl: colocate actor, rollout and reference in the same workers; weights resharded in memory."""
    checkpoint_engine: Any = None
    """Compatibility-only (compat.py); in verl's async recipes: the weight-streaming engine (their YAML points it
    at async_training.checkpoint_engine)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """Training of the policy."""
    ref: RefConfig = field(default_factory=RefConfig)
    """Reference policy for the KL term."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation."""
    nccl_timeout: int = 600
    """Compatibility-only (compat.py); in verl: collective time-out in seconds."""


@dataclass
class PPOConfig:
    """Everything ``python -m hybridflow.trainer.main_ppo`` reads."""

    data: DataConfig = field(default_factory=DataConfig)
    """Prompt data."""
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    """Policy, generation and reference."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """Value model (gae only)."""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """Reward computation."""
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    """A user reward function."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantage estimation."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Loop, logging, checkpoints."""
    ray_kwargs: RayKwargsConfig = field(default_factory=RayKwargsConfig)
    """Ray settings."""
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    """Asynchronous training (main_fully_async / main_one_step_off only)."""
    rollout: AsyncRolloutConfig = field(default_factory=AsyncRolloutConfig)
    """The async rollouter's budget (main_fully_async only)."""
    global_profiler: Dict[str, Any] = field(default_factory=dict)
    """Compatibility-only (compat.py); in verl: nsys / torch profiler settings."""
    distillation: DistillationConfig = field(default_factory=DistillationConfig)
    """On-policy distillation from frozen teacher models (verl 0.9.1's ``distillation.*``)."""

    def __post_init__(self):
        if self.trainer.backend == "auto":  # verl's split placement keys alone pick the Ray backend
            self.trainer.backend = "ray" if self.rollout.n_gpus_per_node > 0 else "local"

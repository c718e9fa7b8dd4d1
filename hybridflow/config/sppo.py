"""The SPPO trainer's config: the PPO schema plus verl ``recipe/sppo``'s keys.

Single source of truth; ``hybridflow/config/sppo_trainer.yaml`` is generated from it
(``hybridflow config dump sppo``). verl's recipe declares ``sppo_eta`` twice, under
``actor_rollout_ref.actor`` (the loss's eta) and ``algorithm`` (its reward soft-mean);
here both are the eta of the loss: set either, and setting both to different values is
an error.
"""

from dataclasses import dataclass, field
from typing import Optional

from hybridflow.config.ppo import ActorConfig, ActorRolloutRefConfig, RolloutConfig
from hybridflow.config.selfplay import SelfPlayAlgorithmConfig, SelfPlayConfig, rollout_field


@dataclass
class SPPOActorConfig(ActorConfig):
    """The trained policy, plus SPPO's eta."""

    sppo_eta: float = 1.0
    """eta of the SPPO loss (log pi/pi_ref - eta (P(y > pi) - 1/2))^2 (Wu et al. 2024, arXiv 2405.00675)."""


@dataclass
class SPPOActorRolloutRefConfig(ActorRolloutRefConfig):
    """Actor (with sppo_eta), rollout (4 responses per prompt by default) and reference."""

    actor: SPPOActorConfig = field(default_factory=SPPOActorConfig)
    """Training of the policy."""
    rollout: RolloutConfig = rollout_field(4)
    """Generation: rollout.n >= 2 responses per prompt estimate each one's win rate."""


@dataclass
class SPPOAlgorithmConfig(SelfPlayAlgorithmConfig):
    """``algorithm.*`` of the SPPO step."""

    sppo_eta: Optional[float] = None
    """verl's ``algorithm.sppo_eta``; when set, the eta of the loss (null = actor_rollout_ref.actor.sppo_eta)."""


@dataclass
class SPPOConfig(SelfPlayConfig):
    """Everything ``python -m hybridflow.trainer.main_sppo`` reads."""

    actor_rollout_ref: SPPOActorRolloutRefConfig = field(default_factory=SPPOActorRolloutRefConfig)
    """Policy, generation and reference."""
    algorithm: SPPOAlgorithmConfig = field(default_factory=SPPOAlgorithmConfig)
    """SPPO's eta."""

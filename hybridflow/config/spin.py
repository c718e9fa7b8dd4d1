"""The SPIN / online DPO trainer's config: the PPO schema plus verl ``recipe/spin``'s keys.

Single source of truth; ``hybridflow/config/spin_trainer.yaml`` is generated from it
(``hybridflow config dump spin``). The keys verl's ``run_spin.sh`` uses all load:
``actor_rollout_ref.actor.dpo_beta`` is the DPO beta (as in the recipe's ``dp_actor``);
``algorithm.kl_ctrl.kl_coef``, which the script also sets, is the PPO in-reward KL
coefficient and has no effect here (it warns).
"""

from dataclasses import dataclass, field

from hybridflow.config.ppo import ActorConfig, ActorRolloutRefConfig, RolloutConfig
from hybridflow.config.selfplay import SelfPlayAlgorithmConfig, SelfPlayConfig, rollout_field


@dataclass
class SPINActorConfig(ActorConfig):
    """The trained policy, plus the DPO temperature."""

    dpo_beta: float = 0.1
    """DPO beta: the implicit reward is beta * log(pi / pi_ref) (Rafailov et al. 2023, eq. 7)."""


@dataclass
class SPINActorRolloutRefConfig(ActorRolloutRefConfig):
    """Actor (with dpo_beta), rollout (2 responses per prompt by default) and reference."""

    actor: SPINActorConfig = field(default_factory=SPINActorConfig)
    """Training of the policy."""
    rollout: RolloutConfig = rollout_field(2)
    """Generation: rollout.n >= 2 responses per prompt; the best and the worst form the pair."""


@dataclass
class SPINAlgorithmConfig(SelfPlayAlgorithmConfig):
    """``algorithm.*`` of the online DPO step."""

    dpo_loss_type: str = "sigmoid"
    """``sigmoid`` (DPO, arXiv 2305.18290) or ``ipo`` (arXiv 2310.12036), as verl's recipe."""
    dpo_label_smoothing: float = 0.0
    """Conservative DPO label smoothing (sigmoid loss only)."""
    preference_source: str = "reward"
    """How pairs are formed: ``reward`` (best vs worst scored sample of each prompt: online DPO, verl's
    recipe) or ``ground_truth`` (the dataset's reward_model.ground_truth as chosen vs each sample: SPIN)."""


@dataclass
class SPINConfig(SelfPlayConfig):
    """Everything ``python -m hybridflow.trainer.main_spin`` reads."""

    actor_rollout_ref: SPINActorRolloutRefConfig = field(default_factory=SPINActorRolloutRefConfig)
    """Policy, generation and reference."""
    algorithm: SPINAlgorithmConfig = field(default_factory=SPINAlgorithmConfig)
    """Preference loss."""

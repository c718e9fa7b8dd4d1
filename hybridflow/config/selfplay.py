"""Config pieces shared by the self-play trainers (SPIN, SPPO) and their checks.

Both schemas are the PPO schema with a few sections extended by the keys of verl's
``recipe/spin`` and ``recipe/sppo`` (``trainer.ref_update_freq``, ``trainer.log_freq``,
``actor.dpo_beta``, ``actor.sppo_eta``, ...). PPO keys that a self-play step does not
read are still accepted, so a verl command line runs unchanged, and each one that is
set warns once (``warn_keys_without_effect``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import OmegaConf

from hybridflow.config.loader import config_value
from hybridflow.config.ppo import AlgorithmConfig, PPOConfig, RolloutConfig, TrainerConfig

logger = logging.getLogger(__name__)


@dataclass
class SelfPlayTrainerConfig(TrainerConfig):
    """The loop, logging and checkpoints, plus the self-play recipes' keys."""

    ref_update_freq: int = 1
    """Copy the actor into the reference policy at the start of every step divisible by this (SPIN's / SPPO's
    iterations: the opponent is the previous iterate); <= 0 keeps the initial model as the reference."""
    log_freq: int = 1
    """Send metrics to the trackers every N steps (verl's recipes: ``+trainer.log_freq``)."""


@dataclass
class SelfPlayAlgorithmConfig(AlgorithmConfig):
    """``algorithm.*``: no advantage estimator (verl's recipes set it to null)."""

    adv_estimator: Optional[str] = None
    """Not used by self-play trainers (accepted for verl compatibility; warns when set)."""


@dataclass
class SelfPlayConfig(PPOConfig):
    """The PPO schema run by a self-play loop: its trainer keys here; SPIN and SPPO add their actor and
    ``algorithm`` keys (``config/spin.py``, ``config/sppo.py``)."""

    trainer: SelfPlayTrainerConfig = field(default_factory=SelfPlayTrainerConfig)
    """Loop, logging, checkpoints, reference refresh."""


def rollout_field(n: int) -> Any:
    """A rollout section whose default is ``n`` responses per prompt."""
    return field(default_factory=lambda: RolloutConfig(n=n))


LEGACY_MICRO_BATCH_SIZES = (
    ("actor_rollout_ref.actor", "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu"),
    ("actor_rollout_ref.rollout", "log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu"),
    ("actor_rollout_ref.ref", "log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu"),
)
"""verl's older global micro-batch sizes (used by the recipes' scripts) and their per-worker keys."""


def resolve_legacy_micro_batch_sizes(cfg: Any, *, world_size: int) -> list[str]:
    """Set each ``*_per_gpu`` size from its global spelling divided by ``world_size``, as verl's workers do.

    Returns problems: both spellings set, or a global size that does not split over the workers."""
    problems = []
    for section, legacy, per_gpu in LEGACY_MICRO_BATCH_SIZES:
        node = config_value(cfg, section)
        value = getattr(node, legacy)
        if value is None:
            continue
        if getattr(node, per_gpu) is not None:
            problems.append(f"{section}.{legacy} and {section}.{per_gpu} are both set: keep only {per_gpu}")
        elif value % world_size or value < world_size:
            problems.append(f"{section}.{legacy}={value} does not split over {world_size} data-parallel workers; "
                            f"set {section}.{per_gpu} instead")
        else:
            setattr(node, per_gpu, value // world_size)
    return problems


KEYS_WITHOUT_EFFECT = (
    "algorithm.adv_estimator", "algorithm.use_kl_in_reward", "algorithm.kl_ctrl.kl_coef", "algorithm.kl_ctrl.type",
    "algorithm.filter_groups.enable", "algorithm.gamma", "algorithm.lam", "critic.enable",
    "actor_rollout_ref.actor.use_kl_loss", "actor_rollout_ref.actor.entropy_coeff",
    "actor_rollout_ref.actor.policy_loss.loss_mode", "actor_rollout_ref.actor.clip_ratio",
    "actor_rollout_ref.actor.clip_ratio_low", "actor_rollout_ref.actor.clip_ratio_high",
    "actor_rollout_ref.actor.shuffle", "actor_rollout_ref.actor.use_rollout_log_probs",
    "trainer.critic_warmup",
)
"""PPO keys a self-play step never reads."""


def warn_keys_without_effect(cfg: Any, schema: type, *, trainer: str, hint: dict[str, str] | None = None) -> list[str]:
    """Warn once for each key of ``KEYS_WITHOUT_EFFECT`` set away from its default; returns those keys."""
    defaults, actual = OmegaConf.structured(schema), OmegaConf.structured(cfg)
    changed = [key for key in KEYS_WITHOUT_EFFECT
               if OmegaConf.select(actual, key) != OmegaConf.select(defaults, key)]
    for key in changed:
        extra = (hint or {}).get(key, "")
        logger.warning("%s=%r has no effect in %s (accepted for verl compatibility)%s", key,
                       OmegaConf.select(actual, key), trainer, f"; {extra}" if extra else "")
    return changed


def self_play_problems(cfg: Any, *, min_n: int) -> list[str]:
    """Problems a self-play config can have beyond the PPO checks."""
    arr, problems = cfg.actor_rollout_ref, []
    if arr.rollout.n < min_n:
        problems.append(f"actor_rollout_ref.rollout.n={arr.rollout.n}: self-play compares responses to the same "
                        f"prompt; set rollout.n >= {min_n}")
    if arr.model.lora_rank > 0 and cfg.trainer.ref_update_freq > 0:
        problems.append("trainer.ref_update_freq > 0 refreshes the reference from the actor, but with LoRA the "
                        "reference is the base model: set trainer.ref_update_freq=-1 or model.lora_rank=0")
    if cfg.trainer.log_freq < 1:
        problems.append(f"trainer.log_freq={cfg.trainer.log_freq} must be >= 1")
    return problems

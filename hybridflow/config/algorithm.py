"""verl's ``algorithm.*``: the advantage estimator, the KL penalty and controller, filtering and corrections.

Part of the PPO trainer's schema (:class:`hybridflow.config.ppo.PPOConfig`); each field's docstring is its
documentation, and ``ppo_trainer.yaml`` is generated from them.
"""

from dataclasses import dataclass, field
from typing import Any, List, Optional

from hybridflow.algos.registry import AdvantageSpec, UnknownAlgorithmError, advantage_spec, list_kl_controllers
from hybridflow.config.checks import check_choice


@dataclass
class KLControlConfig:
    """Coefficient of the in-reward KL penalty (Ziegler et al. 2019, arXiv 1909.08593)."""

    type: str = "fixed"
    """``fixed`` or ``adaptive``."""
    kl_coef: float = 0.001
    """(Initial) KL coefficient."""
    horizon: int = 10000
    """Adaptive controller horizon."""
    target_kl: float = 0.1
    """Adaptive controller target KL."""


@dataclass
class FilterGroupsConfig:
    """DAPO dynamic sampling: drop groups whose responses all score the same."""

    enable: bool = False
    """Keep sampling until the batch is filled with groups that have signal."""
    metric: Optional[str] = None
    """Metric that must vary within a group: ``acc``, ``score`` or ``seq_reward``."""
    max_num_gen_batches: int = 0
    """Give up after this many generation batches (0 = no limit)."""


@dataclass
class PFPPOConfig:
    """PF-PPO (arXiv 2409.06957): resample the batch by reward before the update."""

    reweight_method: str = "pow"
    """Sampling weight of a response from its score r: ``pow`` |r|^weight_pow, ``max_min`` 1 for the batch's
    highest and lowest score and 0 otherwise, ``max_random`` 0.4 for the highest score and 0.1 otherwise."""
    weight_pow: float = 2.0
    """Exponent of the ``pow`` method."""


@dataclass
class RolloutCorrectionConfig:
    """Importance weighting / rejection between the rollout engine's and the trainer's log-probs (verl's
    ``algorithm.rollout_correction``); its ``rollout_corr/*`` metrics are reported whenever old log-probs are
    recomputed."""

    rollout_is: Optional[str] = None
    """Importance weights pi_train / pi_rollout applied in the policy loss: ``token``, ``sequence`` or null (off)."""
    rollout_is_threshold: Any = 2.0
    """A number U clamps the weights at U (truncated IS); a string ``"L_U"`` zeroes weights outside [L, U] (IcePop).
    Write bounds with a decimal point (0.5_2.0): YAML reads 1_2 as the number 12."""
    rollout_is_batch_normalize: bool = False
    """Divide the weights by their batch mean (per token, or per sequence at sequence level)."""
    rollout_rs: Optional[str] = None
    """Reject tokens / sequences too far off-policy, comma-separated options: token_k1..k3, seq_sum_k1..k3,
    seq_mean_k1..k3, seq_max_k2, seq_max_k3 (null = off)."""
    rollout_rs_threshold: Any = None
    """Threshold per rollout_rs option (one shared, or comma separated): an upper bound, or ``"L_U"`` ratio
    bounds for k1 options (with decimal points, as rollout_is_threshold)."""
    bypass_mode: bool = False
    """Use the engine's log-probs as the old ones (no recompute pass) and correct inside the loss
    (``loss_mode`` becomes bypass_mode)."""
    loss_type: str = "ppo_clip"
    """Bypass mode's objective: ``ppo_clip`` (PPO with ratio pi_theta / pi_rollout) or ``reinforce``
    (IS-weighted policy gradient)."""


@dataclass
class AlgorithmConfig:
    """Advantage estimation and KL-in-reward (verl's ``algorithm.*``)."""

    gamma: float = 1.0
    """Discount factor."""
    lam: float = 1.0
    """GAE lambda."""
    adv_estimator: str = "gae"
    """Registered advantage estimator: gae, grpo, rloo, remax, reinforce_plus_plus, gdpo, optimal_token_baseline, ...
    (``hybridflow.algos.list_advantages()``; docs/algorithms.md)."""
    norm_adv_by_std_in_grpo: bool = True
    """GRPO: divide by the group std (false = Dr.GRPO)."""
    use_kl_in_reward: bool = False
    """Subtract kl_coef * KL(actor || ref) from the token rewards."""
    kl_penalty: str = "kl"
    """KL estimator in the reward: kl/k1, abs, mse/k2, low_var_kl/k3, or a '+' variant (straight-through k2 gradient)."""
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    """KL coefficient controller."""
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    """DAPO dynamic sampling."""
    use_pf_ppo: bool = False
    """PF-PPO: resample the batch (with replacement, same size) by reward before the updates."""
    pf_ppo: PFPPOConfig = field(default_factory=PFPPOConfig)
    """PF-PPO's reweighting."""
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """Rollout/trainer mismatch correction (token / sequence importance sampling, rejection, bypass mode)."""
    gdpo_reward_keys: Optional[List[str]] = None
    """gdpo: the reward function's dict keys normalised separately (e.g. [format_reward, accuracy_reward])."""
    gdpo_reward_weights: Optional[List[float]] = None
    """gdpo: one weight per gdpo_reward_keys entry; null = all 1."""
    reward_dpo_coef: float = 5.0
    """prime: weight of the implicit PRM's dense rewards (after their leave-one-out baseline) in the advantages."""
    reward_gt_coef: float = 5.0
    """prime: weight of the outcome reward (after its leave-one-out baseline) in the advantages."""


def critic_enabled(cfg: Any) -> bool:
    """The critic runs when forced on, or by default exactly for estimators registered with ``needs_values``."""
    if cfg.critic.enable is not None:
        return bool(cfg.critic.enable)
    return estimator_spec(cfg.algorithm.adv_estimator).needs_values


def reference_enabled(cfg: Any) -> bool:
    """Reference log-probs are computed when a KL term uses them (in the loss or in the reward) or the estimator's
    spec needs them (``needs_reference``: PRIME's implicit PRM takes its log-ratio to them)."""
    return bool(cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward
                or estimator_spec(cfg.algorithm.adv_estimator).needs_reference)


def implicit_prm_enabled(cfg: Any) -> bool:
    """PRIME's implicit PRM is built and trained exactly for estimators registered with ``needs_implicit_prm``."""
    return estimator_spec(cfg.algorithm.adv_estimator).needs_implicit_prm


def estimator_spec(name: str | None) -> AdvantageSpec:
    """The estimator's registered spec (algos/registry.py, the one module of algos that config reads: what an
    estimator needs); an unknown name needs nothing here and is reported by the registered-name check."""
    try:
        return advantage_spec(name)
    except UnknownAlgorithmError:
        return AdvantageSpec()


def algorithm_problems(cfg: Any) -> list[str]:
    """The ``algorithm.*`` checks: what the estimator needs of the critic, the KL controller, DAPO's filter."""
    algo, problems = cfg.algorithm, []
    if estimator_spec(algo.adv_estimator).needs_values and cfg.critic.enable is False:
        problems.append(f"algorithm.adv_estimator={algo.adv_estimator} needs a critic but critic.enable=False: "
                        "enable the critic or pick a critic-free estimator such as grpo")
    if critic_enabled(cfg) and cfg.critic.model.path in (None, ""):
        problems.append(f"critic.model.path is not set (it is needed because adv_estimator={algo.adv_estimator})")
    check_choice(problems, "algorithm.kl_ctrl.type", algo.kl_ctrl.type, tuple(list_kl_controllers()))
    if algo.filter_groups.enable and not algo.filter_groups.metric:
        problems.append("algorithm.filter_groups.enable=True needs algorithm.filter_groups.metric (acc, score or seq_reward)")
    return problems

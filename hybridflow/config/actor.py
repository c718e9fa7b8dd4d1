"""verl's ``actor_rollout_ref.actor.*`` and ``actor_rollout_ref.ref.*``: the policy update and the reference policy.

Part of the PPO trainer's schema (:class:`hybridflow.config.ppo.PPOConfig`); each field's docstring is its
documentation, and ``ppo_trainer.yaml`` is generated from them.
"""

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from omegaconf import II

from hybridflow.config.algorithm import critic_enabled
from hybridflow.config.common import CheckpointContentsConfig, FSDPConfig, OptimConfig
from hybridflow.config.checks import check_positive, check_sp_size
from hybridflow.config.trainer import ppo_world_size


@dataclass
class PolicyLossConfig:
    """Which policy loss the actor uses and its mode-specific knobs."""

    loss_mode: str = "vanilla"
    """Registered policy loss: vanilla, gspo, gpg, clip_cov, kl_cov, cispo, geo_mean, sapo, dppo_tv, dppo_kl, dro,
    gvpo (``hybridflow.algos.list_policy_losses()``). ``algorithm.rollout_correction.bypass_mode`` replaces it by
    bypass_mode."""
    clip_cov_ratio: float = 0.0002
    """clip_cov: fraction of tokens whose gradient is detached."""
    clip_cov_lb: float = 1.0
    """clip_cov: lower bound of the covariance window."""
    clip_cov_ub: float = 5.0
    """clip_cov: upper bound of the covariance window."""
    kl_cov_ratio: float = 0.0002
    """kl_cov: fraction of tokens that get the KL penalty."""
    ppo_kl_coef: float = 0.1
    """kl_cov: coefficient of the per-token KL penalty."""
    dro_beta: Optional[float] = None
    """dro: coefficient of the quadratic log-ratio penalty; must be set (> 0) when loss_mode=dro."""


@dataclass
class ActorConfig:
    """The trained policy (verl's ``actor_rollout_ref.actor.*``)."""

    strategy: str = "fsdp"
    """Compatibility-only (compat.py); in verl: training backend: ``fsdp``/``fsdp2`` (FSDP2 ``fully_shard``; world size 1 runs it unsharded)."""
    ppo_mini_batch_size: int = 256
    """Prompts per optimizer step (multiplied by rollout.n internally, as in verl)."""
    ppo_micro_batch_size: Optional[int] = None
    """Deprecated global micro-batch size; use ppo_micro_batch_size_per_gpu."""
    ppo_micro_batch_size_per_gpu: Optional[int] = None
    """Sequences per forward/backward on each worker; null = the whole mini-batch shard."""
    use_dynamic_bsz: bool = False
    """Pack micro-batches up to ``ppo_max_token_len_per_gpu`` tokens instead of a fixed count."""
    ppo_max_token_len_per_gpu: int = 16384
    """Token budget of one micro-batch when use_dynamic_bsz."""
    clip_ratio: float = 0.2
    """PPO clip epsilon of a side whose clip_ratio_low/high is null. As in verl 0.9 both are 0.2 by default and
    win, so setting only clip_ratio changes nothing (said once at start-up)."""
    clip_ratio_low: Optional[float] = 0.2
    """Lower clip epsilon (verl 0.9's default 0.2); null = clip_ratio."""
    clip_ratio_high: Optional[float] = 0.2
    """Upper clip epsilon (verl 0.9's default 0.2; DAPO clip-higher uses 0.28); null = clip_ratio."""
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    """Policy loss mode and its parameters."""
    clip_ratio_c: float = 3.0
    """Dual-clip bound for negative advantages (arXiv 1912.09729); must be > 1."""
    loss_agg_mode: str = "token-mean"
    """token-mean, token-sum, seq-mean-token-sum, seq-mean-token-mean or seq-mean-token-sum-norm."""
    loss_scale_factor: Optional[float] = None
    """seq-mean-token-sum-norm: the constant each sequence's token sum is divided by; null = data.max_response_length."""
    tau_pos: float = 1.0
    """sapo: gate temperature for tokens with a positive advantage (arXiv 2511.20347)."""
    tau_neg: float = 1.05
    """sapo: gate temperature for tokens with a non-positive advantage."""
    calculate_sum_pi_squared: bool = False
    """Also compute sum_v pi(v)^2 per token in the old-log-prob pass; needed by the optimal_token_baseline and
    tir_optimal_token_baseline estimators."""
    entropy_coeff: float = 0.0
    """Weight of the entropy bonus in the actor loss (non-zero: ``actor/entropy_loss`` is logged, as in verl)."""
    calculate_entropy: bool = False
    """Compute the entropy in the training forward and log ``actor/entropy_loss`` even when entropy_coeff is 0
    (verl 0.9's key)."""
    use_kl_loss: bool = False
    """Add KL(actor || reference) to the loss (GRPO style) instead of to the reward."""
    use_torch_compile: bool = False
    """torch.compile the log-prob/entropy math from the logits (verl defaults to true; off here: on CPU
    the compile time outweighs the gain, see docs/trainer.md)."""
    kl_loss_coef: float = 0.001
    """Weight of the KL loss."""
    kl_loss_type: str = "low_var_kl"
    """KL estimator of the loss: kl/k1, abs, mse/k2, low_var_kl/k3, or a '+' variant (straight-through k2 gradient)."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    use_rollout_log_probs: bool = False
    """Take the old log-probs from the rollout engine instead of recomputing them (verl's rollout-correction
    bypass mode): saves one forward pass per step. Exact when engine and trainer compute the same
    distribution (native engine, fp32, top_p=1, top_k=-1); the rollout/training mismatch metric is then
    not available."""
    shuffle: bool = False
    """Shuffle sequences between mini-batches."""
    checkpoint: CheckpointContentsConfig = field(default_factory=CheckpointContentsConfig)
    """What actor checkpoints hold."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and schedule."""
    grad_clip: Optional[float] = None
    """verl before 0.9's clip threshold (verl 0.9 ignores it and clips at ``optim.clip_grad``): null follows
    ``optim.clip_grad``; a value set off 1.0 clips there, as before 0.9, with one line at start-up (<= 0 disables
    clipping); refused when ``optim.clip_grad`` is also moved off 1.0 to another value."""
    freeze_vision_tower: bool = False
    """A vision-language policy: the vision tower is not trained (no gradients, weights unchanged)."""
    ulysses_sequence_parallel_size: int = 1
    """Ulysses sequence parallelism: groups of this many ranks split each packed row between them and
    exchange attention heads with all-to-all (hybridflow.models.ulysses); the data-parallel size is
    ranks / this. Must divide nnodes x n_gpus_per_node and the attention heads; needs
    model.use_remove_padding. The local backend (one process) runs whole sequences and warns."""
    entropy_from_logits_with_chunking: bool = False
    """Compatibility-only, no effect (see compat.py)."""
    entropy_checkpointing: bool = False
    """Recompute the entropy's softmax in backward instead of keeping a ``[B, T, V]`` tensor (saves memory)."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 settings."""
    profiler: Dict[str, Any] = field(default_factory=dict)
    """Compatibility-only (compat.py); in verl: this role's nsys / torch profiler settings."""
    # issue 60: verl-recipe's GVPO recipe (its actor config adds this key)
    gvpo_beta: float = 0.1
    """gvpo (``policy_loss.loss_mode=gvpo``, verl-recipe's gvpo): the KL weight beta of GVPO's objective, the scale
    of its implicit reward beta * log(pi_theta / pi_old)."""


@dataclass
class RefConfig:
    """The frozen reference policy (verl's ``actor_rollout_ref.ref.*``)."""

    strategy: str = II("actor_rollout_ref.actor.strategy")
    """Compatibility-only (compat.py); in verl: backend; follows the actor."""
    use_torch_compile: bool = II("actor_rollout_ref.actor.use_torch_compile")
    """torch.compile the log-prob computation."""
    log_prob_micro_batch_size: Optional[int] = None
    """Deprecated; use log_prob_micro_batch_size_per_gpu."""
    log_prob_micro_batch_size_per_gpu: Optional[int] = None
    """Sequences per reference forward on each worker; null = all at once."""
    log_prob_use_dynamic_bsz: bool = II("actor_rollout_ref.actor.use_dynamic_bsz")
    """Token-budget micro-batches for the reference forward."""
    log_prob_max_token_len_per_gpu: int = II("actor_rollout_ref.actor.ppo_max_token_len_per_gpu")
    """Token budget when log_prob_use_dynamic_bsz."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 settings of the reference."""
    ulysses_sequence_parallel_size: int = II("actor_rollout_ref.actor.ulysses_sequence_parallel_size")
    """Sequence parallelism of the reference; it runs in the actor's processes, so it follows
    actor.ulysses_sequence_parallel_size; 1 runs whole sequences on every rank of a group (same values,
    redundant work)."""
    entropy_checkpointing: bool = False
    """Compatibility-only (compat.py); in verl: the reference's entropy memory switch (it computes no entropy)."""
    entropy_from_logits_with_chunking: bool = False
    """Compatibility-only (compat.py); in verl: the reference's entropy memory switch (it computes no entropy)."""
    profiler: Dict[str, Any] = field(default_factory=dict)
    """Compatibility-only (compat.py); in verl: this role's nsys / torch profiler settings."""


# ---------------------------------------------------------------- checks of the actor's section (issue 57: beside it)
def check_ppo_batches(problems: list[str], cfg: Any, world: int) -> None:
    """The train batch splits into mini-batches, and those over ``world`` workers into micro-batches."""
    data, actor, rollout = cfg.data, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    for key, value in (("data.train_batch_size", data.train_batch_size),
                       ("actor_rollout_ref.actor.ppo_mini_batch_size", actor.ppo_mini_batch_size),
                       ("actor_rollout_ref.rollout.n", rollout.n),
                       ("actor_rollout_ref.actor.ppo_epochs", actor.ppo_epochs)):
        check_positive(problems, key, value)
    if any(v is None or v <= 0 for v in (data.train_batch_size, actor.ppo_mini_batch_size, rollout.n)):
        return
    if data.train_batch_size % actor.ppo_mini_batch_size:
        problems.append(
            f"data.train_batch_size={data.train_batch_size} (x rollout.n={rollout.n}) is not divisible by "
            f"actor_rollout_ref.actor.ppo_mini_batch_size={actor.ppo_mini_batch_size} (x rollout.n): "
            "make the mini-batch a divisor of the train batch"
        )
    _check_micro_batches(problems, "actor_rollout_ref.actor", actor.ppo_mini_batch_size * rollout.n, world,
                         actor.ppo_micro_batch_size_per_gpu, actor.use_dynamic_bsz)
    if critic_enabled(cfg):
        critic = cfg.critic
        critic_world = ppo_world_size(cfg, critic.ulysses_sequence_parallel_size)
        _check_micro_batches(problems, "critic", critic.ppo_mini_batch_size * rollout.n, critic_world,
                             critic.ppo_micro_batch_size_per_gpu, critic.use_dynamic_bsz)
    if (data.train_batch_size * rollout.n) % world:
        problems.append(
            f"data.train_batch_size * rollout.n = {data.train_batch_size * rollout.n} sequences cannot be split "
            f"evenly over {world} data-parallel workers: make it a multiple of {world}"
        )


def _check_micro_batches(problems: list[str], section: str, mini_sequences: int, world: int,
                         micro_per_gpu: int | None, dynamic: bool) -> None:
    if mini_sequences % world:
        problems.append(
            f"{section}.ppo_mini_batch_size x rollout.n = {mini_sequences} sequences is not divisible by the "
            f"data-parallel size {world} (trainer.nnodes x trainer.n_gpus_per_node)"
        )
        return
    per_rank = mini_sequences // world
    if micro_per_gpu is not None and not dynamic:
        if micro_per_gpu <= 0:
            problems.append(f"{section}.ppo_micro_batch_size_per_gpu={micro_per_gpu} must be positive")
        elif per_rank % micro_per_gpu:
            problems.append(
                f"{section}: mini-batch of {per_rank} sequences per worker (ppo_mini_batch_size x rollout.n / "
                f"{world} workers) is not divisible by ppo_micro_batch_size_per_gpu={micro_per_gpu}"
            )


def check_sequence_parallel(problems: list[str], cfg: Any) -> None:
    """Ulysses needs packed rows and a size that divides the group's ranks; the reference lives in
    the actor's processes, so it splits sequences like the actor or not at all."""
    arr, ranks = cfg.actor_rollout_ref, cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    sections = [("actor_rollout_ref.actor", arr.actor.ulysses_sequence_parallel_size, arr.model, "actor_rollout_ref.model")]
    if critic_enabled(cfg):
        sections.append(("critic", cfg.critic.ulysses_sequence_parallel_size, cfg.critic.model, "critic.model"))
    for section, size, model, model_key in sections:
        check_sp_size(problems, f"{section}.ulysses_sequence_parallel_size", size, ranks,
                      packed=model.use_remove_padding or model.use_shared_prompt, packing_key=f"{model_key}.use_remove_padding")
    if arr.ref.ulysses_sequence_parallel_size not in (1, arr.actor.ulysses_sequence_parallel_size):
        problems.append(f"actor_rollout_ref.ref.ulysses_sequence_parallel_size={arr.ref.ulysses_sequence_parallel_size} "
                        "differs from actor_rollout_ref.actor.ulysses_sequence_parallel_size="
                        f"{arr.actor.ulysses_sequence_parallel_size}: the reference runs in the actor's processes and "
                        "splits sequences over the same groups (or, at 1, runs them whole); drop the ref key "
                        "(it follows the actor)")


def check_clip_ratios(problems: list[str], actor: Any) -> None:
    """PPO's clip bounds: finite epsilons, a dual-clip bound above 1."""
    if actor.clip_ratio_c <= 1.0:
        problems.append(f"actor_rollout_ref.actor.clip_ratio_c={actor.clip_ratio_c} must be > 1 (dual-clip bound)")
    for name in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
        value = getattr(actor, name)
        if value is not None and not 0 <= value < math.inf:
            problems.append(f"actor_rollout_ref.actor.{name}={value} must be a finite number >= 0 (PPO's clip epsilon, "
                            "typically 0.2; DAPO's clip_ratio_high is 0.28)")

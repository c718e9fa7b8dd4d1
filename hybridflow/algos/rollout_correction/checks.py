"""What ``algorithm.rollout_correction`` and ``algorithm.pf_ppo`` check of a run config before anything loads, owned
here so the trainer names no loss or correction: each check reads the keys through ``setting(key)`` (as an
estimator's or loss's spec does) and returns one line per problem, naming the key and the fix."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.pf_ppo import PF_PPO_METHODS
from hybridflow.algos.policy_losses.bypass import BYPASS_LOSS_TYPES
from hybridflow.algos.rollout_correction.is_weights import IS_LEVELS
from hybridflow.algos.rollout_correction.rejection import parse_options
from hybridflow.algos.rollout_correction.thresholds import parse_bounds, parse_rs_thresholds

Setting = Callable[[str], Any]

BYPASS_REPLACES = "vanilla"
"""The policy loss that bypass mode stands in for: it must be left as the configured one."""


def pf_ppo_problems(setting: Setting) -> list[str]:
    method = setting("algorithm.pf_ppo.reweight_method")
    if setting("algorithm.use_pf_ppo") and method not in PF_PPO_METHODS:
        return [f"algorithm.pf_ppo.reweight_method={method!r}: use one of {', '.join(PF_PPO_METHODS)}"]
    return []


def rollout_correction_problems(setting: Setting) -> list[str]:
    """The correction's level, bypass mode's loss and sampling, and its thresholds (parsed as the loss will)."""
    corr = "algorithm.rollout_correction."
    problems, bypass = [], setting(corr + "bypass_mode")
    rollout_is, loss_type = setting(corr + "rollout_is"), setting(corr + "loss_type")
    loss_mode = setting("actor_rollout_ref.actor.policy_loss.loss_mode")
    if rollout_is is not None and rollout_is not in IS_LEVELS:
        problems.append(f"algorithm.rollout_correction.rollout_is={rollout_is!r}: use token, sequence or null")
    if bypass and loss_type not in BYPASS_LOSS_TYPES:
        problems.append(f"algorithm.rollout_correction.loss_type={loss_type!r}: use ppo_clip or reinforce")
    if bypass and loss_mode != BYPASS_REPLACES:
        problems.append("algorithm.rollout_correction.bypass_mode=True replaces the policy loss (loss_type=ppo_clip is "
                        f"vanilla PPO, or reinforce); leave policy_loss.loss_mode=vanilla, not {loss_mode!r}")
    if bypass and (setting("actor_rollout_ref.rollout.top_p") < 1 or setting("actor_rollout_ref.rollout.top_k") > 0):
        problems.append("algorithm.rollout_correction.bypass_mode=True needs rollout.top_p=1 and rollout.top_k=-1: "
                        "the engine's log-probs are of the filtered distribution, the trainer's are not")
    try:
        if setting(corr + "rollout_is") is not None or setting(corr + "bypass_mode"):  # verl reads it only then
            parse_bounds(setting(corr + "rollout_is_threshold"),
                         what="algorithm.rollout_correction.rollout_is_threshold")
        if setting(corr + "rollout_rs") is not None:
            parse_rs_thresholds(options=parse_options(setting(corr + "rollout_rs")),
                                spec=setting(corr + "rollout_rs_threshold"))
    except AlgorithmError as err:
        problems.append(str(err))
    return problems


def effective_policy_loss(loss_mode: str, *, bypass: bool) -> str:
    """The policy loss the actor trains with: ``loss_mode``, or in verl's bypass mode the loss that compares pi_theta
    with the engine's pi_rollout (``policy_losses/bypass.py``)."""
    return "bypass_mode" if bypass else loss_mode

"""verl's bypass mode: old log-probs are the rollout engine's (``loss_mode=bypass_mode``).

With ``algorithm.rollout_correction.bypass_mode=true`` the trainer skips the old-log-prob
pass and sets pi_old = pi_rollout (two policies instead of three). In every micro-batch
this loss then compares the *current* pi_theta with pi_rollout
(``hybridflow.algos.rollout_correction``): rejected tokens (``rollout_rs``) leave the
mask, and ``loss_type`` picks the objective:

    ppo_clip:   PPO's clipped loss (``vanilla``) with rho = pi_theta / pi_rollout; the
                ratio already is the IS correction, so no extra weights are applied
    reinforce:  l_t = -sg(w_t) A_t log pi_theta(y_t),  w = truncated/masked pi_theta / pi_rollout
                (``rollout_is``; w = 1 when rollout_is is null), ppo_kl from pi_rollout

``rollout_corr/*`` metrics are returned beside the loss's own. What this adds to
``actor.use_rollout_log_probs`` (which only substitutes the old log-probs) is the
per-micro-batch rejection and the REINFORCE objective.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.policy_losses.common import LossAggregation, PolicyLossInputs, policy_loss_metrics
from hybridflow.algos.policy_losses.vanilla import VanillaConfig, vanilla_policy_loss
from hybridflow.algos.registry import register_policy_loss
from hybridflow.algos.rollout_correction import rollout_correction

BYPASS_LOSS_TYPES = ("ppo_clip", "reinforce")


@dataclass(frozen=True)
class BypassConfig(VanillaConfig):
    """PPO's clip (for ``ppo_clip``) plus ``algorithm.rollout_correction``'s choice of objective and correction."""

    loss_type: str = "ppo_clip"
    rollout_is: str | None = None
    rollout_is_threshold: object = 2.0
    rollout_is_batch_normalize: bool = False
    rollout_rs: str | None = None
    rollout_rs_threshold: object = None

    def correction(self) -> dict:
        """The keyword arguments of ``rollout_correction`` (the ``rollout_*`` fields)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name.startswith("rollout_")}


def reinforce_policy_loss(inputs: PolicyLossInputs, agg: LossAggregation) -> tuple[torch.Tensor, dict[str, float]]:
    """-sg(w) A log pi over ``[B, T]`` (w = 1 when ``rollout_is_weights`` is None); ``old_log_prob`` is pi_rollout's."""
    loss = agg(-inputs.advantages * inputs.log_prob, inputs=inputs)
    return loss, policy_loss_metrics(log_ratio=inputs.log_prob - inputs.old_log_prob,
                                     response_mask=inputs.response_mask)


@register_policy_loss("bypass_mode", config=BypassConfig,
                      knobs={"loss_type": "algorithm.rollout_correction.loss_type",
                             "rollout_is": "algorithm.rollout_correction.rollout_is",
                             "rollout_is_threshold": "algorithm.rollout_correction.rollout_is_threshold",
                             "rollout_is_batch_normalize": "algorithm.rollout_correction.rollout_is_batch_normalize",
                             "rollout_rs": "algorithm.rollout_correction.rollout_rs",
                             "rollout_rs_threshold": "algorithm.rollout_correction.rollout_rs_threshold"})
def bypass_mode_policy_loss(inputs: PolicyLossInputs, config: BypassConfig,
                            agg: LossAggregation) -> tuple[torch.Tensor, dict[str, float]]:
    """Bypass-mode loss; ``old_log_prob`` ``[B, T]`` is the rollout engine's. See the module docstring."""
    if config.loss_type not in BYPASS_LOSS_TYPES:
        raise AlgorithmError(f"algorithm.rollout_correction.loss_type={config.loss_type!r}: use ppo_clip or reinforce")
    weights, mask, corr_metrics = rollout_correction(
        train_log_prob=inputs.log_prob.detach(), rollout_log_prob=inputs.old_log_prob,
        response_mask=inputs.response_mask, **config.correction())
    # rejected tokens leave the mask
    if config.loss_type == "reinforce":
        weighted = dataclasses.replace(inputs, response_mask=mask, rollout_is_weights=weights)
        loss, metrics = reinforce_policy_loss(weighted, agg)
    else:  # the ratio already is the correction: IS weights would count it twice
        corrected = PolicyLossInputs.valid(old_log_prob=inputs.old_log_prob, log_prob=inputs.log_prob,
                                           advantages=inputs.advantages, response_mask=mask)
        clip = VanillaConfig(**{f.name: getattr(config, f.name) for f in dataclasses.fields(VanillaConfig)})
        loss, metrics = vanilla_policy_loss.compute(corrected, clip, agg)
    return loss, {**metrics, **corr_metrics}

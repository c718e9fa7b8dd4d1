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

import torch

from hybridflow.algos.agg import agg_loss
from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.policy_losses.common import policy_loss_metrics, select_valid, weight_by_rollout_is
from hybridflow.algos.policy_losses.vanilla import vanilla_policy_loss
from hybridflow.algos.registry import register_policy_loss
from hybridflow.algos.rollout_correction import rollout_correction

BYPASS_LOSS_TYPES = ("ppo_clip", "reinforce")


def reinforce_policy_loss(*, rollout_log_prob, log_prob, advantages, response_mask, rollout_is_weights,
                          loss_agg_mode, global_num_tokens, global_num_seqs, max_response_length):
    """-sg(w) A log pi over ``[B, T]`` (w = 1 when ``rollout_is_weights`` is None)."""
    loss = agg_loss(
        loss_mat=weight_by_rollout_is(losses=-advantages * log_prob, rollout_is_weights=rollout_is_weights),
        loss_mask=response_mask, loss_agg_mode=loss_agg_mode, global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs, max_response_length=max_response_length,
    )
    return loss, policy_loss_metrics(log_ratio=log_prob - rollout_log_prob, response_mask=response_mask)


@register_policy_loss("bypass_mode")
def bypass_mode_policy_loss(
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_type: str = "ppo_clip",
    rollout_is: str | None = None,
    rollout_is_threshold=2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold=None,
    loss_agg_mode: str = "token-mean",
    global_num_tokens: float | None = None,
    global_num_seqs: float | None = None,
    max_response_length: int | None = None,
    **clip_kwargs,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Bypass-mode loss; ``old_log_prob`` ``[B, T]`` is the rollout engine's. See the module docstring."""
    log_prob, old_log_prob = select_valid(log_prob=log_prob, old_log_prob=old_log_prob, response_mask=response_mask)
    if loss_type not in BYPASS_LOSS_TYPES:
        raise AlgorithmError(f"algorithm.rollout_correction.loss_type={loss_type!r}: use ppo_clip or reinforce")
    weights, mask, corr_metrics = rollout_correction(
        train_log_prob=log_prob.detach(), rollout_log_prob=old_log_prob, response_mask=response_mask,
        rollout_is=rollout_is, rollout_is_threshold=rollout_is_threshold,
        rollout_is_batch_normalize=rollout_is_batch_normalize, rollout_rs=rollout_rs,
        rollout_rs_threshold=rollout_rs_threshold,
    )
    common = dict(log_prob=log_prob, advantages=advantages, response_mask=mask, loss_agg_mode=loss_agg_mode,
                  global_num_tokens=global_num_tokens, global_num_seqs=global_num_seqs,
                  max_response_length=max_response_length)
    if loss_type == "reinforce":
        loss, metrics = reinforce_policy_loss(rollout_log_prob=old_log_prob, rollout_is_weights=weights, **common)
    else:
        clip_kwargs.pop("rollout_is_weights", None)  # the ratio is the correction: weights would count it twice
        loss, metrics = vanilla_policy_loss(old_log_prob=old_log_prob, **common, **clip_kwargs)
    return loss, {**metrics, **corr_metrics}

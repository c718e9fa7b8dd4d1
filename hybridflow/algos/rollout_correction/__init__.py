"""Rollout correction: importance weights and rejection between the rollout engine's
log-probs and the trainer's (verl's ``algorithm.rollout_correction.*``).

bf16 engines, other kernels and asynchronous (stale) rollouts sample from pi_rollout,
not from the pi_train the trainer recomputes. ``rollout_correction`` returns

- IS weights ``[B, T]`` (``rollout_is`` = token / sequence, truncated or masked; see
  ``is_weights.py``) that every policy loss multiplies into its per-token loss,
- the response mask with too-far-off tokens or sequences rejected (``rollout_rs``; see
  ``rejection.py``),
- ``rollout_corr/*`` metrics (``metrics.py``).

Decoupled mode (3 policies): the trainer recomputes pi_old, weights = pi_old / pi_rollout
once per batch, PPO's ratio is pi_theta / pi_old. Bypass mode (2 policies): pi_old is
pi_rollout; the ``bypass_mode`` policy loss computes the weights against the current
pi_theta in every micro-batch (``policy_losses/bypass.py``).
"""

from __future__ import annotations

import torch

from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.rollout_correction.is_weights import batch_normalize, rollout_is_weights
from hybridflow.algos.rollout_correction.metrics import is_weight_metrics, offpolicy_metrics, rejection_metrics
from hybridflow.algos.rollout_correction.rejection import RS_OPTIONS, rollout_rejection_mask
from hybridflow.algos.rollout_correction.thresholds import parse_bounds

__all__ = ["RS_OPTIONS", "rollout_correction", "offpolicy_metrics"]


@torch.no_grad()
def rollout_correction(
    *,
    train_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str | None = None,
    rollout_is_threshold=2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold=None,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """``(IS weights [B, T] or None, response mask [B, T] after rejection, rollout_corr/* metrics)``.

    ``train_log_prob`` / ``rollout_log_prob`` ``[B, T]``: log-probs of the sampled tokens under the
    trainer's and the engine's policy. The returned mask has ``response_mask``'s dtype.
    """
    if train_log_prob.shape != rollout_log_prob.shape or train_log_prob.shape != response_mask.shape:
        raise AlgorithmError(f"rollout correction needs equal shapes, got trainer {tuple(train_log_prob.shape)}, "
                             f"rollout {tuple(rollout_log_prob.shape)}, mask {tuple(response_mask.shape)}")
    valid = response_mask.bool()
    # padding is garbage by contract: select it out before anything is exponentiated
    log_ratio = torch.where(valid, train_log_prob - rollout_log_prob, torch.zeros_like(train_log_prob))
    metrics: dict[str, float] = {}
    weights = None
    if rollout_is is not None:
        weights, raw = rollout_is_weights(log_ratio=log_ratio, response_mask=valid, level=rollout_is,
                                          threshold=rollout_is_threshold)
        lower, upper = parse_bounds(rollout_is_threshold, what="rollout_is_threshold")
        # statistics of the weights before batch normalisation, as verl
        metrics.update(is_weight_metrics(weights=weights, raw=raw, response_mask=valid, level=rollout_is,
                                         lower=lower, upper=upper))
        if rollout_is_batch_normalize:
            weights, metrics["rollout_is_batch_norm_factor"] = batch_normalize(weights=weights, response_mask=valid,
                                                                               level=rollout_is)
    kept = valid
    if rollout_rs is not None:
        kept, statistics, bounds = rollout_rejection_mask(log_ratio=log_ratio, response_mask=valid,
                                                          rollout_rs=rollout_rs, threshold=rollout_rs_threshold)
        metrics.update(rejection_metrics(kept=kept, statistics=statistics, bounds=bounds, response_mask=valid))
    metrics.update(offpolicy_metrics(train_log_prob=train_log_prob, rollout_log_prob=rollout_log_prob,
                                     response_mask=valid))
    mask = kept.to(response_mask.dtype)
    return weights, mask, {f"rollout_corr/{key}": value for key, value in metrics.items()}

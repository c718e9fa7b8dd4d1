"""Importance weights between the trainer's and the rollout engine's policy (``rollout_is``).

The rollout engine samples from pi_rollout (another kernel, dtype or an older checkpoint);
the trainer's policy is pi_train. Off-policy correction (Espeholt et al., IMPALA, arXiv
1802.01561; Yao et al., "Your Efficient RL Framework Secretly Brings You Off-Policy RL
Training", 2025) reweights each token or sequence by rho = pi_train / pi_rollout, with
``d_t = log pi_train(y_t) - log pi_rollout(y_t)`` (clamped to +-20 before ``exp``)::

    token:     w_t = exp(d_t)                                       [B, T]
    sequence:  w_i = exp(sum_t m_t d_t), the same on every token   [B, T]

    TIS     (threshold "U"):    w <- min(w, U)                       (truncated IS)
    IcePop  (threshold "L_U"):  w <- w if L <= w <= U else 0          (masked IS)
    batch_normalize:            w <- w / mean(w)   (token mean, or mean over sequences)

Weights are 0 on masked tokens and carry no gradient.
"""

from __future__ import annotations

import torch

from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.rollout_correction.thresholds import parse_bounds
from hybridflow.algos.stats import masked_mean, masked_sum

SAFETY_BOUND = 20.0
IS_LEVELS = ("token", "sequence")


def raw_is_weights(*, log_ratio: torch.Tensor, response_mask: torch.Tensor, level: str) -> torch.Tensor:
    """Untruncated rho ``[B, T]`` at ``level`` (token or sequence), 0 on masked tokens."""
    if level not in IS_LEVELS:
        raise AlgorithmError(f"algorithm.rollout_correction.rollout_is={level!r}: use token, sequence or null")
    valid = response_mask.bool()
    if level == "token":
        log_weights = log_ratio
    else:
        log_weights = masked_sum(values=log_ratio, mask=valid, dim=-1)[:, None].expand_as(log_ratio)
    weights = log_weights.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()
    return torch.where(valid, weights, torch.zeros_like(weights))


def bound_weights(*, weights: torch.Tensor, lower: float | None, upper: float) -> torch.Tensor:
    """TIS (``lower`` None: clamp at ``upper``) or IcePop (zero outside ``[lower, upper]``)."""
    if lower is None:
        return weights.clamp(max=upper)
    inside = (weights >= lower) & (weights <= upper)
    return torch.where(inside, weights, torch.zeros_like(weights))


def batch_mean_weight(*, weights: torch.Tensor, response_mask: torch.Tensor, level: str) -> torch.Tensor:
    """The mean used by ``rollout_is_batch_normalize``: over tokens, or over (non-empty) sequences."""
    if level == "token":
        return masked_mean(values=weights, mask=response_mask)
    per_sequence = masked_mean(values=weights, mask=response_mask, dim=-1)
    return masked_mean(values=per_sequence, mask=response_mask.sum(dim=-1) > 0)


@torch.no_grad()
def rollout_is_weights(
    *, log_ratio: torch.Tensor, response_mask: torch.Tensor, level: str, threshold=2.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights [B, T] after TIS / IcePop, raw weights [B, T])``.

    ``log_ratio`` ``[B, T]`` is log pi_train - log pi_rollout; ``threshold`` as in the module docstring.
    """
    lower, upper = parse_bounds(threshold, what="algorithm.rollout_correction.rollout_is_threshold")
    raw = raw_is_weights(log_ratio=log_ratio, response_mask=response_mask, level=level)
    return bound_weights(weights=raw, lower=lower, upper=upper), raw


@torch.no_grad()
def batch_normalize(*, weights: torch.Tensor, response_mask: torch.Tensor, level: str) -> tuple[torch.Tensor, float]:
    """``(weights / their batch mean, the mean)``; unchanged (factor 1) when the mean is ~0."""
    mean = batch_mean_weight(weights=weights, response_mask=response_mask, level=level).item()
    return (weights / mean, mean) if mean > 1e-8 else (weights, 1.0)

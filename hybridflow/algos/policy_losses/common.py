"""Pieces shared by the policy losses: the clamped importance ratio and the clip range."""

from __future__ import annotations

import torch

from hybridflow.algos.errors import AlgorithmError

# exp(20) ~ 5e8 is finite in fp32 and bf16; a larger log-ratio only means "far off-policy".
LOG_RATIO_BOUND = 20.0


def clamped_log_ratio(*, log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    """log pi_theta - log pi_old ``[B, T]``, clamped to +-20 so that exp() stays finite."""
    return (log_prob - old_log_prob).clamp(min=-LOG_RATIO_BOUND, max=LOG_RATIO_BOUND)


def clip_range(
    *, clip_ratio: float, clip_ratio_low: float | None, clip_ratio_high: float | None
) -> tuple[float, float]:
    """(eps_low, eps_high): the decoupled bounds of DAPO's clip-higher, each defaulting to eps."""
    low = clip_ratio if clip_ratio_low is None else clip_ratio_low
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    if low < 0 or high < 0:
        raise AlgorithmError(f"clip ratios must be >= 0, got low={low}, high={high}; fix actor.clip_ratio_low/high")
    return low, high

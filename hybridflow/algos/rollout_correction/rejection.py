"""Rejection of tokens or sequences too far off-policy (``rollout_rs``): a hard trust region.

With ``d_t = log pi_train(y_t) - log pi_rollout(y_t)`` (clamped to +-20), the per-token
divergences of pi_train from pi_rollout (Schulman, "Approximating KL Divergence", 2020)::

    k1_t = -d_t            k2_t = d_t^2 / 2            k3_t = exp(d_t) - 1 - d_t

An option ``<level>_<k>`` names a statistic and where it is taken:

    token_k*       per token                     -> rejects that token
    seq_sum_k*     sum_t m_t k_t per sequence    -> rejects the whole sequence
    seq_mean_k*    mean over valid tokens        -> rejects the whole sequence
    seq_max_k2/k3  max over valid tokens         -> rejects the whole sequence

k2/k3 statistics must be <= the upper threshold; k1 statistics must lie in
``[log L, log U]``: k1 is signed, so its thresholds are bounds on the ratio
pi_rollout / pi_train (verl's sign), ``U`` alone meaning ``L = 1/U``. Several options,
comma separated, must all pass. The result is the response mask with rejected tokens set
to 0 (verl's ``rollout_rs``).
"""

from __future__ import annotations

import math

import torch

from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.rollout_correction.is_weights import SAFETY_BOUND
from hybridflow.algos.rollout_correction.thresholds import parse_rs_thresholds
from hybridflow.algos.stats import masked_mean, masked_sum

RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
              "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")


def token_divergences(*, log_ratio: torch.Tensor) -> dict[str, torch.Tensor]:
    """k1, k2, k3 per token ``[B, T]`` (see the module docstring)."""
    d = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {"k1": -d, "k2": 0.5 * d.square(), "k3": d.exp() - 1.0 - d}


def _sequence_max(*, values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    top = values.masked_fill(~valid, -torch.inf).max(dim=-1).values
    return torch.where(torch.isfinite(top), top, torch.zeros_like(top))


def option_statistic(*, option: str, divergences: dict[str, torch.Tensor], valid: torch.Tensor) -> torch.Tensor:
    """The statistic of one option, per token ``[B, T]`` (sequence statistics broadcast)."""
    level, kind = option.rsplit("_", 1)
    per_token = divergences[kind]
    if level == "token":
        return per_token
    reduce = {"seq_sum": lambda: masked_sum(values=per_token, mask=valid, dim=-1),
              "seq_mean": lambda: masked_mean(values=per_token, mask=valid, dim=-1),
              "seq_max": lambda: _sequence_max(values=per_token, valid=valid)}[level]
    return reduce()[:, None].expand_as(per_token)


def parse_options(rollout_rs: str) -> list[str]:
    """The distinct options of a comma-separated ``rollout_rs``, in order; unknown ones are an error."""
    options = list(dict.fromkeys(part.strip() for part in str(rollout_rs).split(",") if part.strip()))
    unknown = [option for option in options if option not in RS_OPTIONS]
    if not options or unknown:
        raise AlgorithmError(f"algorithm.rollout_correction.rollout_rs={rollout_rs!r}: use one or more of "
                             f"{', '.join(RS_OPTIONS)} (comma separated)")
    return options


@torch.no_grad()
def rollout_rejection_mask(
    *, log_ratio: torch.Tensor, response_mask: torch.Tensor, rollout_rs: str, threshold
) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, tuple[float, float]]]:
    """``(kept mask [B, T] bool, statistic [B, T] per option, (low, high) bound per option)``.

    ``log_ratio`` ``[B, T]`` is log pi_train - log pi_rollout; a token is kept if it is valid and
    every option's statistic lies within its bounds (k1 bounds are in log space).
    """
    options = parse_options(rollout_rs)
    bounds = parse_rs_thresholds(options=options, spec=threshold)
    valid = response_mask.bool()
    divergences = token_divergences(log_ratio=log_ratio)
    kept, statistics, log_bounds = valid.clone(), {}, {}
    for option in options:
        lower, upper = bounds[option]
        low, high = (math.log(lower), math.log(upper)) if option.endswith("k1") else (-math.inf, upper)
        statistic = option_statistic(option=option, divergences=divergences, valid=valid)
        kept &= (statistic >= low) & (statistic <= high)
        statistics[option], log_bounds[option] = statistic, (low, high)
    return kept, statistics, log_bounds

"""Diagnostics of the rollout/trainer gap: IS-weight, rejection and off-policy metrics.

Names follow verl's ``rollout_corr/*`` (the caller adds the prefix). Sequence statistics
are over sequences with at least one valid token (verl also counts empty rows).
"""

from __future__ import annotations

import math

import torch

from hybridflow.algos.rollout_correction.is_weights import SAFETY_BOUND
from hybridflow.algos.stats import masked_mean, masked_sum


def _valid_extremes(values: torch.Tensor, valid: torch.Tensor) -> tuple[float, float]:
    picked = values[valid]
    return (picked.max().item(), picked.min().item()) if picked.numel() else (0.0, 0.0)


def _spread(values: torch.Tensor) -> float:
    return values.std().item() if values.numel() > 1 else 0.0


def is_weight_metrics(*, weights: torch.Tensor, raw: torch.Tensor, response_mask: torch.Tensor, level: str,
                      lower: float | None, upper: float) -> dict[str, float]:
    """Statistics of the applied weights ``[B, T]`` and of the raw ones (before TIS / IcePop)."""
    valid = response_mask.bool()
    rows = valid.any(dim=-1)
    low = 1.0 / upper if lower is None else lower
    per_sequence = masked_mean(values=weights, mask=valid, dim=-1)[rows]
    raw_per_sequence = masked_mean(values=raw, mask=valid, dim=-1)[rows]
    # the unit the threshold applies to: one weight per sequence, or one per token
    units = raw_per_sequence if level == "sequence" else raw[valid]
    clipped = weights.clamp(0.0, upper)
    mean = masked_mean(values=clipped, mask=valid)
    normalised = clipped / (mean + 1e-8)
    # sequence level reports the raw (untruncated) extremes, token level the applied ones (as verl)
    w_max, w_min = _valid_extremes(raw if level == "sequence" else weights, valid)
    metrics = {
        "rollout_is_mean": masked_mean(values=weights, mask=valid).item(),
        "rollout_is_max": w_max, "rollout_is_min": w_min,
        "rollout_is_std": (masked_mean(values=clipped.square(), mask=valid) - mean.square()).clamp(min=0).sqrt().item(),
        "rollout_is_eff_sample_size": 1.0 / max(masked_mean(values=normalised.square(), mask=valid).item(), 1e-12),
        "rollout_is_ratio_fraction_high": (units > upper).float().mean().item() if units.numel() else 0.0,
        "rollout_is_ratio_fraction_low": (units < low).float().mean().item() if units.numel() else 0.0,
    }
    if per_sequence.numel():
        metrics.update({
            "rollout_is_seq_mean": per_sequence.mean().item(), "rollout_is_seq_std": _spread(per_sequence),
            "rollout_is_seq_max": per_sequence.max().item(), "rollout_is_seq_min": per_sequence.min().item(),
            "rollout_is_seq_max_deviation": (per_sequence - 1.0).abs().max().item(),
            "rollout_is_seq_fraction_high": (raw_per_sequence > upper).float().mean().item(),
            "rollout_is_seq_fraction_low": (raw_per_sequence < low).float().mean().item(),
        })
    if lower is not None:
        outside = (raw < lower) | (raw > upper)
        metrics["rollout_is_oob_ratio"] = masked_mean(values=outside.float(), mask=valid).item()
    return metrics


def _option_metrics(*, statistic: torch.Tensor, low: float, high: float, sequence_level: bool,
                    valid: torch.Tensor, rows: torch.Tensor) -> dict[str, float]:
    """verl's per-option statistics (names without the ``rollout_rs_<option>`` prefix)."""
    signed = low != -math.inf  # k1: a two-sided range
    per_sequence = (statistic[:, 0] if sequence_level else masked_mean(values=statistic, mask=valid, dim=-1))[rows]
    units = per_sequence if sequence_level else statistic[valid]
    top, bottom = _valid_extremes(statistic, valid)
    clamped = statistic.clamp(low if signed else 0.0, high)
    spread = masked_mean(values=clamped.square(), mask=valid) - masked_mean(values=clamped, mask=valid).square()
    metrics = {
        "_mean": masked_mean(values=statistic, mask=valid).item(), "_max": top, "_min": bottom,
        "_fraction_high": _fraction(units > high), "_fraction_low": _fraction(units < low),
        "_std": spread.clamp(min=0).sqrt().item(),
    }
    if per_sequence.numel():
        metrics.update({"_seq_mean": per_sequence.mean().item(), "_seq_std": _spread(per_sequence),
                        "_seq_max": per_sequence.max().item(), "_seq_min": per_sequence.min().item(),
                        "_seq_max_deviation": per_sequence.abs().max().item(),
                        "_seq_fraction_high": _fraction(per_sequence > high)})
        if signed:
            metrics["_seq_fraction_low"] = _fraction(per_sequence < low)
    return metrics


def _fraction(flags: torch.Tensor) -> float:
    return flags.float().mean().item() if flags.numel() else 0.0


def rejection_metrics(*, kept: torch.Tensor, statistics: dict[str, torch.Tensor],
                      bounds: dict[str, tuple[float, float]], response_mask: torch.Tensor) -> dict[str, float]:
    """Per option: statistics of its divergence (over tokens, and per sequence), fractions outside its
    bounds and rejected; overall: fraction of tokens rejected and of sequences with a rejected token."""
    valid = response_mask.bool()
    rows = valid.any(dim=-1)
    metrics = {}
    for option, statistic in statistics.items():
        low, high = bounds[option]
        prefix = f"rollout_rs_{option}"
        option_metrics = _option_metrics(statistic=statistic, low=low, high=high,
                                         sequence_level=not option.startswith("token"), valid=valid, rows=rows)
        metrics.update({prefix + key: value for key, value in option_metrics.items()})
        option_kept = (statistic >= low) & (statistic <= high)
        metrics[f"{prefix}_masked_fraction"] = masked_mean(values=(~option_kept).float(), mask=valid).item()
        metrics[f"{prefix}_seq_masked_fraction"] = _rejected_rows(option_kept, valid, rows)
    metrics["rollout_rs_masked_fraction"] = masked_mean(values=(~kept).float(), mask=valid).item()
    metrics["rollout_rs_seq_masked_fraction"] = _rejected_rows(kept, valid, rows)
    return metrics


def _rejected_rows(kept: torch.Tensor, valid: torch.Tensor, rows: torch.Tensor) -> float:
    rejected = (valid & ~kept).any(dim=-1)
    return rejected[rows].float().mean().item() if rows.any() else 0.0


def offpolicy_metrics(*, train_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor,
                      response_mask: torch.Tensor) -> dict[str, float]:
    """KL(pi_rollout || pi_train) (k1 and k3), perplexities and chi^2 divergences of the IS weights."""
    valid = response_mask.bool()
    rows = valid.any(dim=-1)
    if not rows.any():
        return {}
    log_ratio = torch.where(valid, train_log_prob - rollout_log_prob, torch.zeros_like(train_log_prob))
    safe = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    train_mean = masked_mean(values=train_log_prob, mask=valid, dim=-1)[rows]
    rollout_mean = masked_mean(values=rollout_log_prob, mask=valid, dim=-1)[rows]
    log_ppl_diff = rollout_mean - train_mean
    sequence_log_ratio = masked_sum(values=log_ratio, mask=valid, dim=-1)[rows].clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {
        "training_ppl": (-train_mean).exp().mean().item(),
        "training_log_ppl": (-train_mean).mean().item(),
        "rollout_ppl": (-rollout_mean).exp().mean().item(),
        "rollout_log_ppl": (-rollout_mean).mean().item(),
        "kl": masked_mean(values=-log_ratio, mask=valid).item(),
        "k3_kl": masked_mean(values=safe.exp() - safe - 1, mask=valid).item(),
        "log_ppl_diff": log_ppl_diff.mean().item(),
        "log_ppl_abs_diff": log_ppl_diff.abs().mean().item(),
        "log_ppl_diff_max": log_ppl_diff.max().item(),
        "log_ppl_diff_min": log_ppl_diff.min().item(),
        "ppl_ratio": log_ppl_diff.exp().mean().item(),
        "chi2_token": (masked_mean(values=(2 * safe).exp(), mask=valid) - 1.0).item(),
        "chi2_seq": ((2 * sequence_log_ratio).exp().mean() - 1.0).item(),
    }

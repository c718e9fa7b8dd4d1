"""Masked statistics over response tokens.

Every function takes ``values`` and a same-shaped ``mask`` (bool, int or float; 1 marks
a valid token). Empty selections give 0, never NaN: an all-masked row is normal (a
micro-batch of padding, an aborted sample).
"""

from __future__ import annotations

import torch


def masked_sum(*, values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum(values * mask) over ``dim`` (all dims when None)."""
    mask = mask.to(values.dtype)
    # where, not only a product: a NaN/inf under the mask (padding) must not leak in
    weighted = torch.where(mask > 0, values * mask, torch.zeros_like(values))
    return weighted.sum() if dim is None else weighted.sum(dim=dim)


def masked_mean(*, values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum(values * mask) / max(sum(mask), 1); 0 where nothing is selected."""
    count = mask.to(values.dtype).sum() if dim is None else mask.to(values.dtype).sum(dim=dim)
    return masked_sum(values=values, mask=mask, dim=dim) / count.clamp(min=1)


def masked_var(*, values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the selected entries, with Bessel's n / (n - 1) when ``unbiased``.

    With fewer than two selected entries the correction is skipped (verl raises), so a
    single valid token has variance 0.
    """
    mean = masked_mean(values=values, mask=mask)
    variance = masked_mean(values=(values - mean) ** 2, mask=mask)
    if not unbiased:
        return variance
    count = mask.to(values.dtype).sum()
    # where, not an if: no host sync on GPU
    bessel = torch.where(count > 1, count / (count - 1).clamp(min=1), torch.ones_like(count))
    return variance * bessel


def masked_whiten(
    *, values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """(values - mean) / sqrt(var + eps) over the selected entries (unbiased variance).

    With ``shift_mean=False`` the mean is added back, only the scale changes.
    """
    mean = masked_mean(values=values, mask=mask)
    whitened = (values - mean) * torch.rsqrt(masked_var(values=values, mask=mask) + eps)
    return whitened if shift_mean else whitened + mean

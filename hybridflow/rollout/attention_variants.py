"""What the native decoder's attention adds for some architectures: a sliding window and tanh soft-capping.

Sliding window ``W`` (Beltagy et al. 2020, "Longformer"; Mistral, Gemma's local layers): query at position
``i`` sees keys ``j`` with ``i - W < j <= i`` (HF's ``sliding_window_overlay``: ``W`` keys, itself included).

Soft-capping (Gemma 2): scores ``s = scale * q k^T`` become ``c * tanh(s / c)`` before the mask and the
softmax. SDPA has no hook for it, so a capped layer runs the eager form (scores, cap, mask, fp32 softmax,
``@ v``), as HF's ``eager_attention_forward`` does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def prefill_mask(length: int, offset: int, window: int | None, device) -> torch.Tensor | None:
    """``[length, offset + length]`` bool, True where new row ``r`` (position ``offset + r``) may attend;
    None for plain causal attention over the new rows only (SDPA's ``is_causal``)."""
    if offset == 0 and window is None:
        return None
    query = torch.arange(offset, offset + length, device=device)[:, None]
    key = torch.arange(offset + length, device=device)[None]
    visible = key <= query
    return visible if window is None else visible & (key > query - window)


def decode_mask(positions: torch.Tensor, context: int, window: int | None, dtype: torch.dtype) -> torch.Tensor:
    """``[N, 1, 1, context]`` additive mask: slot ``n`` sees its first ``positions[n] + 1`` keys (later cache
    entries are stale), and with a window only the last ``W`` of them."""
    key = torch.arange(context, device=positions.device)[None]
    hidden = key > positions[:, None]
    if window is not None:
        hidden = hidden | (key <= positions[:, None] - window)
    mask = torch.zeros(positions.shape[0], 1, 1, context, dtype=dtype, device=positions.device)
    return mask.masked_fill_(hidden[:, None, None, :], float("-inf"))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: torch.Tensor | None, scale: float,
              softcap: float | None, grouped: bool = False) -> torch.Tensor:
    """``softmax(cap(scale q k^T) + mask) v`` over ``[..., T, D]`` operands; ``mask`` bool (True = attend) or
    additive, None = causal. ``grouped``: ``k`` / ``v`` have fewer heads (dim -3) than ``q`` (GQA)."""
    if softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale,
                                              enable_gqa=grouped)
    if grouped:
        repeats = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(repeats, dim=-3), v.repeat_interleave(repeats, dim=-3)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    if mask is None:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)

"""What the native decoder's attention adds for some architectures: a sliding window and tanh soft-capping.

Sliding window ``W`` (Beltagy et al. 2020, "Longformer"; Mistral, Gemma's local layers): query at position
``i`` sees keys ``j`` with ``i - W < j <= i`` (HF's ``sliding_window_overlay``: ``W`` keys, itself included).

Soft-capping (Gemma 2): scores ``s = scale * q k^T`` become ``c * tanh(s / c)`` before the mask and the
softmax. SDPA has no hook for it, so a capped layer runs the eager form (scores, cap, mask, fp32 softmax,
``@ v``), as HF's ``eager_attention_forward`` does.
"""

from __future__ import annotations

import torch

from hybridflow.models.segment_attention import capped_attention


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


attention = capped_attention
"""``attention(q, k, v, *, mask, scale, softcap, grouped)``: SDPA, or the eager capped form (one definition,
shared with training's segment attention)."""

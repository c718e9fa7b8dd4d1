"""A masked unit's attention on a CPU in bf16 as one autograd function (issue 62): fp32 scores, bf16 probabilities.

A shared-prompt unit (one prompt and its ``n`` responses, :mod:`hybridflow.models.segment_attention`) attends under
an ``[L, L]`` mask; a masked SDPA call on a CPU runs the flash kernel tile by tile with the mask added to every tile,
which at a few hundred tokens a unit is slower than these few matmuls (docs/benchmarks.md, "The masked unit
attention"). Per unit:

    forward:   S = scale (q k^T)  in fp32 (q, k cast up: no bf16 rounding of the scores),  P = softmax(S + mask)
               o = P_bf16 v        (bf16 matmul, fp32 accumulation)
    backward:  dv = P^T do,   dP = do v^T,   dS = P (dP - rowsum(dP P)) scale,   dq = dS k,   dk = dS^T q

with the query heads of one KV head stacked as rows (``[H_kv, g L, D]``): no repeated K / V, and the KV gradients
summed over the group by the matmul itself. Kept for backward: the unit's bf16 ``P`` (``H L^2`` x 2 bytes), which
is why only units up to :data:`MAX_UNIT_TOKENS` take this path. As close to fp64 as the flash kernel
(tests/models/test_unit_attention.py bounds it), not bit for bit the same: a bf16 behaviour pin recorded before this
needs re-recording.
"""

from __future__ import annotations

import torch

MAX_UNIT_TOKENS = 512
"""Longest unit that runs here: its kept bf16 probabilities (``H x L^2 x 2`` bytes, 4.7 MiB for 9 heads at 512) stay
within about half of the unit's other kept activations; longer units take SDPA's flash kernel (no ``L^2`` state)."""
REDUCED_DTYPES = (torch.bfloat16,)
"""Dtypes that take this path: bf16, the CPU's mixed precision (measured); fp16 and fp32 keep SDPA."""


def takes_unit_attention(query: torch.Tensor, mask: torch.Tensor | None, dropout: float) -> bool:
    """Whether a unit (``query [1, H, L, D]`` in the dtype attention runs in) runs :func:`masked_unit_attention`: a
    unit with a bool mask on a CPU in bf16, no dropout, at most :data:`MAX_UNIT_TOKENS` tokens."""
    return (mask is not None and mask.dtype == torch.bool and query.device.type == "cpu"
            and query.dtype in REDUCED_DTYPES and not dropout and query.shape[0] == 1
            and query.shape[-2] <= MAX_UNIT_TOKENS)


def masked_unit_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                          scale: float | None) -> torch.Tensor:
    """``softmax(scale q k^T + mask) v`` of one unit: ``query [1, H, L, D]``, ``key / value [1, H_kv, L, D]`` (GQA
    where ``H_kv < H``), ``mask`` bool ``[L, L]`` (True = attend) -> ``[1, H, L, D]`` in the query's dtype."""
    return _MaskedUnitAttention.apply(query, key, value, mask, query.shape[-1] ** -0.5 if scale is None else scale)


class _MaskedUnitAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, mask, scale):
        heads, length, dim = query.shape[1:]
        kv_heads = key.shape[1]
        group = heads // kv_heads
        rows = query[0].reshape(kv_heads, group * length, dim)  # query head h reads KV head h // group
        wide = torch.promote_types(query.dtype, torch.float32)  # the scores' dtype: fp32 (fp64 stays fp64)
        with torch.autocast(query.device.type, enabled=False):
            scores = torch.matmul(rows.to(wide), key[0].to(wide).transpose(-1, -2))
            scores = scores.view(kv_heads, group, length, length)
            # the dtype's minimum, not -inf: a fully masked row stays finite (as capped_attention's)
            scores.mul_(scale).masked_fill_(~mask, torch.finfo(scores.dtype).min)
            probs = torch.softmax(scores, dim=-1).to(query.dtype).view(kv_heads, group * length, length)
            out = torch.matmul(probs, value[0]).view(1, heads, length, dim)
        ctx.save_for_backward(rows, key, value, probs)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        rows, key, value, probs = ctx.saved_tensors
        kv_heads, group_rows, dim = rows.shape
        with torch.autocast(grad_out.device.type, enabled=False):
            grad_rows = grad_out[0].to(rows.dtype).reshape(kv_heads, group_rows, dim)
            grad_value = torch.matmul(probs.transpose(-1, -2), grad_rows)
            wide = torch.promote_types(rows.dtype, torch.float32)
            grad_probs = torch.matmul(grad_rows, value[0].transpose(-1, -2)).to(wide)
            p = probs.to(wide, copy=True)
            grad_scores = p.mul_(grad_probs.sub_((grad_probs * p).sum(-1, keepdim=True))).mul_(ctx.scale)
            grad_scores = grad_scores.to(rows.dtype)
            grad_query = torch.matmul(grad_scores, key[0]).view(grad_out.shape)
            grad_key = torch.matmul(grad_scores.transpose(-1, -2), rows)
        return grad_query, grad_key[None], grad_value[None], None, None

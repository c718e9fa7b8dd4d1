"""A masked unit's attention on a CPU in bf16 as one autograd function (issue 62): fp32 scores, bf16 probabilities.

A shared-prompt unit (one prompt and its ``n`` responses, :mod:`hybridflow.models.segment_attention`) attends under
an ``[L, L]`` mask; a masked SDPA call on a CPU runs the flash kernel tile by tile with the mask added to every tile,
which at a few hundred tokens a unit is slower than these few matmuls (docs/benchmarks.md, "The masked unit
attention"). Per unit:

    forward:   S = scale (q k^T)  in fp32 (q, k cast up: no bf16 rounding of the scores),  P = softmax(S + mask)
               o = P_bf16 v        (bf16 matmul, fp32 accumulation)
    backward:  dv = P^T do,   dP = do v^T,   dS = P (dP - rowsum(dP P)) scale,   dq = dS k,   dk = dS^T q

with the query heads of one KV head stacked as rows (``[H_kv, g L, D]``): no repeated K / V, and the KV gradients
summed over the group by the matmul itself. Given the unit's structure ``[P, R_1, ..., R_n]`` (the segment layout's
``branches``, where no sliding window narrowed the mask) only the blocks the mask opens are computed
(:class:`_SharedPromptUnitAttention`: about half the scores of a GRPO unit with ragged responses, a third with equal
ones); any other mask computes all ``L^2`` (:class:`_MaskedUnitAttention`). Kept for backward: the bf16 ``P`` (``H``
x the kept scores x 2 bytes), which is why only units keeping up to :data:`MAX_KEPT_SCORES` a head take this path.
As close to fp64 as the flash kernel (tests/models/test_unit_attention.py bounds it), not bit for bit the same: a bf16
behaviour pin recorded before this needs re-recording.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

MAX_KEPT_SCORES = 512 * 512
"""Most scores a unit keeps per head (as bf16 probabilities for backward): a dense unit keeps ``L^2`` (512 tokens at
the limit: 4.7 MiB for 9 heads), a shared-prompt unit's blocks ``P^2 + n R_max (P + R_max)``. Within about half of
the unit's other kept activations; a bigger unit takes SDPA's flash kernel (no ``L^2`` state)."""
REDUCED_DTYPES = (torch.bfloat16,)
"""Dtypes that take this path: bf16, the CPU's mixed precision (measured); fp16 and fp32 keep SDPA."""


def shared_prompt_blocks(length: int, branches: list[int] | None) -> list[int] | None:
    """``[P, R_1, ..., R_n]`` without empty responses where ``branches`` describe a unit of ``length`` tokens with a
    prompt and at least one response (the block-sparse path), else None (the dense masked path)."""
    if branches is None or len(branches) < 2 or branches[0] < 1 or sum(branches) != length:
        return None
    responses = [n for n in branches[1:] if n]
    return [branches[0], *responses] if responses else None


def kept_scores(length: int, branches: list[int] | None = None) -> int:
    """Scores per head a unit of ``length`` tokens keeps for backward: its blocks' where it has a shared-prompt
    structure (:func:`shared_prompt_blocks`), else ``L^2``."""
    blocks = shared_prompt_blocks(length, branches)
    if blocks is None:
        return length * length
    prompt, widest = blocks[0], max(blocks[1:])
    return prompt * prompt + (len(blocks) - 1) * widest * (prompt + widest)


def takes_unit_attention(query: torch.Tensor, mask: torch.Tensor | None, dropout: float,
                         branches: list[int] | None = None) -> bool:
    """Whether a unit (``query [1, H, L, D]`` in the dtype attention runs in) runs :func:`masked_unit_attention`: a
    unit with a bool mask on a CPU in bf16, no dropout, keeping at most :data:`MAX_KEPT_SCORES` scores a head."""
    return (mask is not None and mask.dtype == torch.bool and query.device.type == "cpu"
            and query.dtype in REDUCED_DTYPES and not dropout and query.shape[0] == 1
            and kept_scores(query.shape[-2], branches) <= MAX_KEPT_SCORES)


def masked_unit_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                          scale: float | None, branches: list[int] | None = None) -> torch.Tensor:
    """``softmax(scale q k^T + mask) v`` of one unit: ``query [1, H, L, D]``, ``key / value [1, H_kv, L, D]`` (GQA
    where ``H_kv < H``), ``mask`` bool ``[L, L]`` (True = attend) -> ``[1, H, L, D]`` in the query's dtype.
    ``branches`` ``[P, R_1, ..., R_n]``: the mask is the shared-prompt one of these lengths (the caller's promise),
    computed block by block; None: every score under the mask."""
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    blocks = shared_prompt_blocks(query.shape[-2], branches)
    if blocks is None:
        return _MaskedUnitAttention.apply(query, key, value, mask, scale)
    blocks = _block_indices(tuple(blocks), query.dtype)
    return _SharedPromptUnitAttention.apply(query, key, value, blocks, scale)


def _attend(rows, keys, values, bias, group: int, scale: float):
    """Probabilities (``rows``' dtype, kept for backward) and output of ``rows [..., g X, D]`` (the query heads of a
    KV head stacked) against ``keys / values [..., K, D]``; ``bias`` 0 where a score is seen and the dtype's minimum
    where masked (not -inf: a fully masked row stays finite, as capped_attention's), broadcast against
    ``[..., g, X, K]``: an added bias costs a tenth of a broadcast ``masked_fill_``. Scores in fp32 from the cast-up
    operands (fp64 stays fp64), the scale applied to the (smaller) keys."""
    wide = torch.promote_types(rows.dtype, torch.float32)
    scores = torch.matmul(rows.to(wide), keys.to(wide, copy=True).mul_(scale).transpose(-1, -2))
    scores.view(*scores.shape[:-2], group, -1, scores.shape[-1]).add_(bias)
    probs = torch.softmax(scores, dim=-1).to(rows.dtype)
    return probs, torch.matmul(probs, values)


def _attend_backward(grad_rows, rows, keys, values, probs, scale: float):
    """(d rows, d keys, d values) of :func:`_attend` from its kept probabilities: ``dv = P^T do``, ``dP = do v^T``,
    ``dS = P (dP - rowsum(dP P)) scale``, ``dq = dS k``, ``dk = dS^T q`` (the group's KV gradients summed by the
    matmul)."""
    grad_values = torch.matmul(probs.transpose(-1, -2), grad_rows)
    wide = torch.promote_types(rows.dtype, torch.float32)
    grad_probs = torch.matmul(grad_rows, values.transpose(-1, -2)).to(wide)
    p = probs.to(wide, copy=True)
    grad_scores = p.mul_(grad_probs.sub_((grad_probs * p).sum(-1, keepdim=True))).mul_(scale).to(rows.dtype)
    return torch.matmul(grad_scores, keys), torch.matmul(grad_scores.transpose(-1, -2), rows), grad_values


def _mask_bias(blocked: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive bias of a bool ``blocked`` (True = masked) in the scores' dtype."""
    return torch.zeros(blocked.shape, dtype=dtype).masked_fill_(blocked, torch.finfo(dtype).min)


class _MaskedUnitAttention(torch.autograd.Function):
    """Every ``[L, L]`` score under the mask: any bool mask."""

    @staticmethod
    def forward(ctx, query, key, value, mask, scale):
        heads, length, dim = query.shape[1:]
        kv_heads = key.shape[1]
        rows = query[0].reshape(kv_heads, heads // kv_heads * length, dim)  # query head h reads KV head h // group
        with torch.autocast(query.device.type, enabled=False):
            bias = _mask_bias(~mask, torch.promote_types(query.dtype, torch.float32))
            probs, out = _attend(rows, key[0], value[0], bias, heads // kv_heads, scale)
        ctx.save_for_backward(rows, key, value, probs)
        ctx.scale = scale
        return out.view(1, heads, length, dim)

    @staticmethod
    def backward(ctx, grad_out):
        rows, key, value, probs = ctx.saved_tensors
        with torch.autocast(grad_out.device.type, enabled=False):
            grad_rows = grad_out[0].to(rows.dtype).reshape(rows.shape)
            grad_query, grad_key, grad_value = _attend_backward(grad_rows, rows, key[0], value[0], probs, ctx.scale)
        return grad_query.view(grad_out.shape), grad_key[None], grad_value[None], None, None


@dataclass(frozen=True)
class _Blocks:
    """Where a shared-prompt unit's blocks read and write (token positions within the unit) for its ``n`` non-empty
    responses padded to the longest, ``R``, and their masks as additive biases in the scores' dtype."""

    prompt: int
    responses: int
    widest: int
    rows: torch.Tensor
    """``[n R]`` each padded response slot's token (padding repeats the response's last one: finite, unused)."""
    keys: torch.Tensor
    """``[n (P + R)]`` each response's keys: the prompt, then its own tokens (padded as ``rows``)."""
    slots: torch.Tensor
    """``[sum R_i]`` each response token's padded slot (``response R + index``), in the unit's order."""
    kept: torch.Tensor
    """``[n R, 1]`` 1 on a response's slots, 0 on padding (in the query's dtype): the padding's output gradient is
    zeroed, so it adds nothing to K / V (a product: a broadcast ``masked_fill_`` costs ten times more)."""
    prompt_bias: torch.Tensor
    """``[P, P]`` masked above the diagonal."""
    bias: torch.Tensor
    """``[n, 1, R, P + R]`` masked where a response slot may not look: its own later tokens and the padding."""


@functools.lru_cache(maxsize=64)
def _block_indices(blocks: tuple[int, ...], dtype: torch.dtype) -> _Blocks:
    """A unit's :class:`_Blocks`, built once for every layer of a forward and its backward. At most 64 kept: a bias
    is ``4 n R (P + R)`` bytes, up to 1 MiB under :data:`MAX_KEPT_SCORES` (a micro-batch with more units rebuilds
    them each layer: a few small ops)."""
    wide = torch.promote_types(dtype, torch.float32)
    prompt, lengths = blocks[0], torch.tensor(blocks[1:])
    count, widest = len(blocks) - 1, max(blocks[1:])
    starts = prompt + torch.cumsum(lengths, 0) - lengths
    slot = torch.arange(widest)
    rows = starts[:, None] + torch.minimum(slot[None, :], lengths[:, None] - 1)  # [n, R]
    keys = torch.cat([torch.arange(prompt).expand(count, prompt), rows], dim=1)
    own = (slot[None, :] <= slot[:, None])[None] & (slot[None, None, :] < lengths[:, None, None])
    seen = torch.cat([torch.ones(count, widest, prompt, dtype=torch.bool), own], dim=2)
    slots = torch.cat([torch.arange(n) + widest * index for index, n in enumerate(blocks[1:])])
    return _Blocks(prompt, count, widest, rows.flatten(), keys.flatten(), slots,
                   (slot[None, :] < lengths[:, None]).reshape(-1, 1).to(dtype),
                   _mask_bias(~torch.ones(prompt, prompt, dtype=torch.bool).tril(), wide),
                   _mask_bias(~seen[:, None], wide))


def _tokens(heads: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
    """A unit's ``[H, L, D]`` as tokens ``[L, H D]`` (the ``index`` ones where given): a view where the heads come
    from HF's ``[L, H, D]`` projections, so the gather copies whole rows."""
    tokens = heads.transpose(0, 1).reshape(heads.shape[1], -1)
    return tokens if index is None else tokens.index_select(0, index)


class _SharedPromptUnitAttention(torch.autograd.Function):
    """A shared-prompt unit block by block: the prompt's rows against the prompt's keys (causal), and the ``n``
    responses at once, padded to the longest, each against ``[prompt keys ; its own keys]`` (causal on its own part):
    ``P^2 + n R (P + R)`` scores a head instead of ``L^2``. The prompt's K / V gradients sum the prompt block's and
    every response's."""

    @staticmethod
    def forward(ctx, query, key, value, blocks: _Blocks, scale):
        heads, length, dim = query.shape[1:]
        kv_heads, prompt, count, widest = key.shape[1], blocks.prompt, blocks.responses, blocks.widest
        group = heads // kv_heads
        # query head h reads KV head h // g: each KV head's query heads stacked as rows
        prompt_rows = query[0, :, :prompt].reshape(kv_heads, group * prompt, dim)
        response_rows = _tokens(query[0], blocks.rows).view(count, widest, kv_heads, group, dim).permute(
            2, 0, 3, 1, 4).reshape(kv_heads, count, group * widest, dim)
        response_keys, response_values = (
            _tokens(tensor[0], blocks.keys).view(count, prompt + widest, kv_heads, dim).permute(2, 0, 1, 3)
            .contiguous() for tensor in (key, value))  # [H_kv, n, P + R, D]
        with torch.autocast(query.device.type, enabled=False):
            prompt_probs, prompt_out = _attend(prompt_rows, key[0, :, :prompt], value[0, :, :prompt],
                                               blocks.prompt_bias, group, scale)
            response_probs, response_out = _attend(response_rows, response_keys, response_values, blocks.bias,
                                                   group, scale)
        ctx.save_for_backward(prompt_rows, response_rows, key, value, response_keys, response_values, prompt_probs,
                              response_probs)
        ctx.blocks, ctx.scale = blocks, scale
        return _to_unit(prompt_out, response_out, blocks, heads)

    @staticmethod
    def backward(ctx, grad_out):
        (prompt_rows, response_rows, key, value, response_keys, response_values, prompt_probs,
         response_probs) = ctx.saved_tensors
        blocks, prompt, heads = ctx.blocks, ctx.blocks.prompt, grad_out.shape[1]
        kv_heads, count, _, dim = response_rows.shape
        with torch.autocast(grad_out.device.type, enabled=False):
            grad = grad_out[0].to(prompt_rows.dtype)
            grad_prompt = grad[:, :prompt].reshape(prompt_rows.shape)
            grad_responses = _tokens(grad, blocks.rows).mul_(blocks.kept).view(
                count, blocks.widest, kv_heads, heads // kv_heads, dim).permute(2, 0, 3, 1, 4).reshape(
                response_rows.shape)
            prompt_grads = _attend_backward(grad_prompt, prompt_rows, key[0, :, :prompt], value[0, :, :prompt],
                                            prompt_probs, ctx.scale)
            response_grads = _attend_backward(grad_responses, response_rows, response_keys, response_values,
                                              response_probs, ctx.scale)
        grad_query = _to_unit(prompt_grads[0], response_grads[0], blocks, heads)
        grad_key, grad_value = (_kv_gradient(own, responses, blocks)
                                for own, responses in zip(prompt_grads[1:], response_grads[1:]))
        return grad_query, grad_key, grad_value, None, None


def _to_unit(prompt: torch.Tensor, responses: torch.Tensor, blocks: _Blocks, heads: int) -> torch.Tensor:
    """Stacked rows ``prompt [H_kv, g P, D]`` and padded ``responses [H_kv, n, g R, D]`` -> ``[1, H, L, D]`` in the
    unit's token order (a view of ``[L, H, D]``, the layout the caller transposes to)."""
    kv_heads, count, _, dim = responses.shape
    padded = responses.view(kv_heads, count, -1, blocks.widest, dim).permute(1, 3, 0, 2, 4).reshape(
        count * blocks.widest, heads * dim)
    tokens = torch.cat([_tokens(prompt.view(heads, -1, dim)), padded.index_select(0, blocks.slots)])
    return tokens.view(-1, heads, dim).transpose(0, 1)[None]


def _kv_gradient(prompt: torch.Tensor, responses: torch.Tensor, blocks: _Blocks) -> torch.Tensor:
    """A K or V gradient ``[1, H_kv, L, D]`` from the prompt block's ``[H_kv, P, D]`` and the responses'
    ``[H_kv, n, P + R, D]``: the prompt's keys summed over the prompt block and every response."""
    kv_heads, count, _, dim = responses.shape
    own = responses[:, :, blocks.prompt:].permute(1, 2, 0, 3).reshape(count * blocks.widest, kv_heads * dim)
    tokens = torch.cat([_tokens(prompt + responses[:, :, :blocks.prompt].sum(1)), own.index_select(0, blocks.slots)])
    return tokens.view(-1, kv_heads, dim).transpose(0, 1)[None]

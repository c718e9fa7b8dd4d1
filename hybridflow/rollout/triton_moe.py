"""Routed experts as two grouped GEMMs in Triton: graph-safe, each used expert's weights read about once a step.

The graph-safe torch path (:func:`hybridflow.rollout.moe.gathered_experts`) gathers each (token, expert) pair's
whole expert, ``[N k, 2 I, hidden]`` and ``[N k, hidden, I]``: 13 GB and 6 GB a layer in bf16 for Qwen3-30B-A3B
(hidden 2048, I 768, top-8) at 256 decode rows, against 1.2 GB for all 128 experts read once. Here, as in vLLM's ``fused_moe`` and SGLang (Shazeer et al. 2017 for the layer; the
block-aligned grouping is theirs, the code is not), the ``N k`` pairs are grouped by expert on the device and
every program multiplies a block of one expert's pairs by a tile of that expert's weights:

1. :func:`align_pairs`: static shapes, no host values. Pair ``p = n k + j`` (token ``n``'s ``j``-th choice)
   goes to its expert's group; each group is padded to a multiple of ``BLOCK_M``, so a block of
   ``BLOCK_M`` slots holds one expert's pairs only. Padding slots hold ``N k`` (past the last pair).
2. :func:`grouped_gemm` twice: ``gate|up`` with SwiGLU fused (``silu(x W_g^T) * (x W_u^T)``, the rows read
   from ``hidden[p // k]``), then ``down`` over those activations, each row scaled by its routing weight.
   Rows are written at their pair's index, so a token's ``k`` rows are contiguous and summed by one
   ``view(N, k, hidden).sum(1)`` (deterministic: no atomics).

Blocks past the used slots (known only on the device) return at once; the grid is the static bound.
Rounding follows HF's expert loop (``act(gate) * up`` and the down projection in the model dtype, the weighted
row rounded to it); only the k-sum differs (fp32 accumulation, rounded once, as :func:`gathered_experts`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class PairBlocks:
    """The ``N k`` (token, expert) pairs grouped by expert in blocks of ``block_m`` (:func:`align_pairs`)."""

    sorted_pairs: torch.Tensor
    """``[P_max]`` int32: pair indices, each expert's contiguous and ascending, its group padded with ``N k``."""
    block_expert: torch.Tensor
    """``[P_max / block_m]`` int32: the expert of each block (``E`` for blocks past the used slots)."""
    used_slots: torch.Tensor
    """``[1]`` int32: the padded slots in use (a multiple of ``block_m``); later blocks are idle."""
    block_m: int


def slot_bound(pairs: int, experts: int, block_m: int) -> int:
    """The static ``P_max``: every pair, plus ``block_m - 1`` padding for each expert that can have pairs
    (at most ``min(E, N k)``), rounded up to whole blocks."""
    return triton.cdiv(pairs + min(experts, pairs) * (block_m - 1), block_m) * block_m


def align_pairs(ids: torch.Tensor, experts: int, block_m: int) -> PairBlocks:
    """Group the pairs of ``ids`` ``[N, k]`` (expert ids ``< experts``) by expert in blocks of ``block_m``.

    Torch ops with static shapes only (no ``bincount`` / ``nonzero``, which read sizes back to the host): a pair's
    place in its group is its running count over ``[N k, E]`` hits, so no sort is needed.
    """
    flat = ids.reshape(-1)
    pairs = flat.shape[0]
    hits = flat[:, None] == torch.arange(experts, device=flat.device)  # [N k, E]
    running = hits.to(torch.int32).cumsum(0, dtype=torch.int32)  # [N k, E]: pairs of each expert so far
    rank = running.gather(1, flat[:, None]).squeeze(1) - 1  # [N k]: place within its expert's group
    padded = (running[-1] + block_m - 1) // block_m * block_m  # [E]: each group's padded size
    ends = padded.cumsum(0, dtype=torch.int32)
    slots = slot_bound(pairs, experts, block_m)
    sorted_pairs = torch.full((slots,), pairs, dtype=torch.int32, device=flat.device)
    sorted_pairs.scatter_(0, (ends - padded)[flat].long() + rank,
                          torch.arange(pairs, dtype=torch.int32, device=flat.device))
    block_starts = torch.arange(0, slots, block_m, dtype=torch.int32, device=flat.device)
    block_expert = torch.searchsorted(ends, block_starts, right=True).to(torch.int32)
    return PairBlocks(sorted_pairs=sorted_pairs, block_expert=block_expert, used_slots=ends[-1:], block_m=block_m)


@triton.jit
def _grouped_gemm_kernel(X, W, Out, SortedPairs, BlockExpert, UsedSlots, RoutingWeights, pairs,
                         stride_x, stride_we, stride_wn, stride_wk, stride_o,
                         ROWS_PER_X: tl.constexpr, COLUMNS: tl.constexpr, DEPTH: tl.constexpr,
                         SWIGLU: tl.constexpr, WEIGHTED: tl.constexpr, WIDEN: tl.constexpr, PRECISION: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    block, tile = tl.program_id(0), tl.program_id(1)
    if block * BLOCK_M >= tl.load(UsedSlots):
        return
    expert = tl.load(BlockExpert + block).to(tl.int64)
    pair = tl.load(SortedPairs + block * BLOCK_M + tl.arange(0, BLOCK_M))
    real = pair < pairs
    x_rows = tl.where(real, pair // ROWS_PER_X, 0).to(tl.int64)
    cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    inside = cols < COLUMNS
    depth = tl.arange(0, BLOCK_K)
    x_ptrs = X + x_rows[:, None] * stride_x + depth[None, :]
    w_ptrs = W + expert * stride_we + cols[None, :].to(tl.int64) * stride_wn + depth[:, None] * stride_wk
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in range(0, DEPTH, BLOCK_K):
        in_depth = start + depth < DEPTH
        x = tl.load(x_ptrs + start, mask=real[:, None] & in_depth[None, :], other=0.0)
        w = tl.load(w_ptrs + start * stride_wk, mask=in_depth[:, None] & inside[None, :], other=0.0)
        if WIDEN:  # the interpreter's dot mishandles bf16 (numpy has none): widen the tiles there
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(x, w, acc, input_precision=PRECISION)
        if SWIGLU:  # the up rows sit COLUMNS rows below the gate rows
            w_up = tl.load(w_ptrs + COLUMNS * stride_wn + start * stride_wk,
                           mask=in_depth[:, None] & inside[None, :], other=0.0)
            if WIDEN:
                w_up = w_up.to(tl.float32)
            acc_up = tl.dot(x, w_up, acc_up, input_precision=PRECISION)
    dtype = Out.dtype.element_ty
    out = acc.to(dtype).to(tl.float32)
    if SWIGLU:  # HF: silu(gate) and its product with up, each rounded to the model dtype
        activated = (out / (1.0 + tl.exp(-out))).to(dtype).to(tl.float32)
        out = activated * acc_up.to(dtype).to(tl.float32)
    if WEIGHTED:
        out = out * tl.load(RoutingWeights + pair, mask=real, other=0.0).to(tl.float32)[:, None]
    targets = Out + pair[:, None].to(tl.int64) * stride_o + cols[None, :]
    tl.store(targets, out.to(dtype), mask=real[:, None] & inside[None, :])


def _block(size: int, cap: int) -> int:
    """A tile edge for a dimension of ``size``: a power of two from 16 (``tl.dot``'s least) to ``cap``."""
    return max(16, min(cap, triton.next_power_of_2(size)))


def grouped_gemm(x: torch.Tensor, weight: torch.Tensor, blocks: PairBlocks, *, pairs: int, rows_per_x: int,
                 swiglu: bool, routing_weights: torch.Tensor | None = None, block_n: int = 64,
                 block_k: int = 64) -> torch.Tensor:
    """For each pair ``p < pairs``: ``x[p // rows_per_x] @ weight[e_p]^T``, ``[pairs, C]``.

    ``weight`` ``[E, C, K]`` (``[E, 2 C, K]`` with ``swiglu``: gate rows then up rows, giving
    ``silu(gate) * up``); ``x`` ``[*, K]``; ``routing_weights`` ``[pairs]`` scales each row when given.
    The grid is static (``P_max / block_m`` blocks by the column tiles); idle blocks return at once.
    """
    x = x.contiguous()
    columns = weight.shape[1] // 2 if swiglu else weight.shape[1]
    depth = weight.shape[2]
    out = torch.empty(pairs, columns, dtype=x.dtype, device=x.device)
    block_n, block_k = _block(columns, block_n), _block(depth, block_k)
    grid = (blocks.block_expert.shape[0], triton.cdiv(columns, block_n))
    _grouped_gemm_kernel[grid](
        x, weight, out, blocks.sorted_pairs, blocks.block_expert, blocks.used_slots,
        routing_weights if routing_weights is not None else out, pairs,
        x.stride(0), weight.stride(0), weight.stride(1), weight.stride(2), out.stride(0),
        ROWS_PER_X=rows_per_x, COLUMNS=columns, DEPTH=depth, SWIGLU=swiglu, WEIGHTED=routing_weights is not None,
        WIDEN=x.device.type == "cpu", PRECISION="ieee" if x.dtype == torch.float32 else "tf32",  # fp32: no TF32
        BLOCK_M=blocks.block_m, BLOCK_N=block_n, BLOCK_K=block_k,
    )
    return out


def block_m_for(pairs: int, experts: int) -> int:
    """Rows a block: 16 while experts average at most 16 pairs (decode: padding costs little, idle lanes
    nothing, since weight reads bound the step), else 64 (fewer blocks re-reading each weight tile)."""
    return 16 if pairs <= 16 * experts else 64


def grouped_swiglu_experts(hidden: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
                           down: torch.Tensor, *, block_m: int | None = None, block_n: int = 64,
                           block_k: int = 64) -> torch.Tensor:
    """The routed SwiGLU experts of ``hidden`` ``[N, hidden]``: routing ``weights`` and expert ``ids`` ``[N, k]``,
    ``gate_up`` ``[E, 2 I, hidden]``, ``down`` ``[E, hidden, I]``; returns ``[N, hidden]``. Graph-safe. The tile
    edges default to :func:`block_m_for` and 64 x 64 (untuned: ``benchmarks/moe_experts.py --tiles`` compares others)."""
    count, top_k = ids.shape
    experts, pairs = gate_up.shape[0], count * top_k
    blocks = align_pairs(ids, experts, block_m or block_m_for(pairs, experts))
    tiles = dict(block_n=block_n, block_k=block_k)
    activated = grouped_gemm(hidden, gate_up, blocks, pairs=pairs, rows_per_x=top_k, swiglu=True, **tiles)  # [N k, I]
    out = grouped_gemm(activated, down, blocks, pairs=pairs, rows_per_x=1, swiglu=False,
                       routing_weights=weights.reshape(-1), **tiles)  # [N k, hidden], weighted
    return out.view(count, top_k, -1).sum(dim=1)

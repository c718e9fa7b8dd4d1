"""Decode attention of multi-head latent attention (MLA: DeepSeek-V3, Kimi-K2) over the latent paged cache, as Triton
kernels (CUDA; the CPU tests run them interpreted).

The cache holds one entry a token and layer, ``[c | k_pe]``: the latent ``c`` (``kv_lora_rank`` = ``R`` values) and
the rotated key ``k_pe`` (``qk_rope_head_dim`` = ``P``) that every head shares (:mod:`hybridflow.rollout.mla`). In the
absorbed form the query arrives already moved into latent space, ``[q_nope W_UK_h | q_pe]`` ``[N, H, R + P]``, so a
head's score is ``q_nope W_UK_h . c + q_pe . k_pe`` over the cached entries and its output ``sum_t p_t c_t`` stays in
latent space ``[N, H, R]`` (the decoder multiplies by ``W_UV_h`` after). All ``H`` query heads share the one key head:
a program takes ``BLOCK_H`` of them, so each tile of latents is read once for ``BLOCK_H`` heads (DeepSeek-V3: 128
heads, 8 programs a row and split, against 128 reads of every latent one head a program).

The structure is :mod:`hybridflow.rollout.triton_attention`'s flash-decoding: program ``(row, head block, split)``
walks the row's live tiles of ``BLOCK_N`` positions through its block table (static shapes: graph-safe), with an online
softmax; with one split a row it writes the output itself, else each split writes its partial output and log-sum-exp
and that module's combine kernel merges them. The tiles and splits come from the same chooser
(:func:`~hybridflow.rollout.triton_attention.choose_config`, with the head blocks in place of KV heads and the
entry width ``R + P`` as the head size). ``R`` and ``P`` need not be powers of two (``tl.arange``): the latent and rope
parts load as ``BLOCK_R`` / ``BLOCK_P`` wide tiles, masked.

Shapes: ``q`` ``[N, H, R + P]``; ``latents`` ``[blocks, B, R + P]`` (one layer of the one-part cache); ``block_tables``
``[N, W]`` int32; ``lengths`` ``[N]``; returns ``[N, H, R]`` (a view of a ``[N, H, BLOCK_R]`` buffer) in ``q``'s dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hybridflow.rollout.triton_attention import (_INTERPRETED, NO_WINDOW, DecodeConfig, _combine_kernel, _dot,
                                                 _sm_count, choose_config)

BLOCK_H = 16
"""Query heads a program (``tl.dot``'s smallest tile side): every latent a tile reads serves this many heads."""


@triton.jit
def _mla_tile(q_nope, q_pe, table, tile, end, scale, running_max, running_sum, acc, latents, stride_lb, stride_lt,
              ranks, in_rank, ropes, in_rope, RANK: tl.constexpr, BLOCK_N: tl.constexpr, PAGE: tl.constexpr,
              PRECISION: tl.constexpr, INTERPRETED: tl.constexpr):
    """One tile of ``BLOCK_N`` positions from ``tile`` folded into the running softmax of ``BLOCK_H`` heads; positions
    at or past ``end`` load nothing and weigh nothing."""
    positions = tile + tl.arange(0, BLOCK_N)
    live = positions < end
    blocks = tl.load(table + positions // PAGE, mask=live, other=0).to(tl.int64)
    entries = latents + blocks * stride_lb + (positions % PAGE) * stride_lt  # [BLOCK_N] row starts
    c_t = tl.load(entries[None, :] + ranks[:, None], mask=in_rank[:, None] & live[None, :], other=0.0)
    pe_t = tl.load(entries[None, :] + RANK + ropes[:, None], mask=in_rope[:, None] & live[None, :], other=0.0)
    scores = (_dot(q_nope, c_t, PRECISION, INTERPRETED) + _dot(q_pe, pe_t, PRECISION, INTERPRETED)) * scale
    scores = tl.where(live[None, :], scores, float("-inf"))
    new_max = tl.maximum(running_max, tl.max(scores, 1))  # finite: a tile holds at least one live position
    rescale = tl.exp(running_max - new_max)
    weights = tl.exp(scores - new_max[:, None])
    running_sum = running_sum * rescale + tl.sum(weights, 1)
    # The latents again as ``[BLOCK_N, R]`` (the values: an operand as loaded, L1 / L2 hits): sm_90's pipeliner then
    # keeps both tiles in shared memory a stage ahead (a tl.trans of c_t stays in registers: nothing in flight).
    c = tl.load(entries[:, None] + ranks[None, :], mask=live[:, None] & in_rank[None, :], other=0.0)
    acc = acc * rescale[:, None] + _dot(weights.to(c.dtype), c, PRECISION, INTERPRETED)
    return new_max, running_sum, acc


@triton.jit
def _mla_split_kernel(Q, Latents, Lengths, Tables, PartOut, PartLse, Out, scale,
                      stride_qn, stride_qh, stride_lb, stride_lt, stride_tn, stride_pn, stride_ph, stride_ps,
                      stride_ln, stride_lh, stride_on, stride_oh,
                      HEADS: tl.constexpr, BLOCK_H: tl.constexpr, RANK: tl.constexpr, BLOCK_R: tl.constexpr,
                      ROPE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_LEN: tl.constexpr,
                      PAGE: tl.constexpr, PRECISION: tl.constexpr, NUM_STAGES: tl.constexpr, DIRECT: tl.constexpr,
                      INTERPRETED: tl.constexpr):
    row, head_block, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    length = tl.load(Lengths + row).to(tl.int32)
    start = split * SPLIT_LEN
    if start >= length:
        return  # the combine kernel never reads this split
    heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    in_heads = heads < HEADS
    ranks, ropes = tl.arange(0, BLOCK_R), tl.arange(0, BLOCK_P)
    in_rank, in_rope = ranks < RANK, ropes < ROPE
    q_rows = Q + row * stride_qn + heads[:, None] * stride_qh
    q_nope = tl.load(q_rows + ranks[None, :], mask=in_heads[:, None] & in_rank[None, :], other=0.0)
    q_pe = tl.load(q_rows + RANK + ropes[None, :], mask=in_heads[:, None] & in_rope[None, :], other=0.0)
    table = Tables + row * stride_tn
    running_max = tl.full([BLOCK_H], float("-inf"), tl.float32)
    running_sum = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_R], tl.float32)
    end = tl.minimum(start + SPLIT_LEN, length)
    if INTERPRETED:  # triton_attention._INTERPRETED: the interpreter's tl.range takes no loaded bound
        tile = start
        while tile < end:
            running_max, running_sum, acc = _mla_tile(
                q_nope, q_pe, table, tile, end, scale, running_max, running_sum, acc, Latents, stride_lb, stride_lt,
                ranks, in_rank, ropes, in_rope, RANK, BLOCK_N, PAGE, PRECISION, INTERPRETED)
            tile += BLOCK_N
    else:
        for tile in tl.range(start, end, BLOCK_N, num_stages=NUM_STAGES):
            running_max, running_sum, acc = _mla_tile(
                q_nope, q_pe, table, tile, end, scale, running_max, running_sum, acc, Latents, stride_lb, stride_lt,
                ranks, in_rank, ropes, in_rope, RANK, BLOCK_N, PAGE, PRECISION, INTERPRETED)
    out = acc / running_sum[:, None]
    if DIRECT:  # the whole row in this program: its output, no partials
        out_ptr = Out + row * stride_on + heads[:, None] * stride_oh + ranks[None, :]
        tl.store(out_ptr, out.to(Out.dtype.element_ty), mask=in_heads[:, None])
    else:
        out_ptr = PartOut + row * stride_pn + heads[:, None] * stride_ph + split * stride_ps + ranks[None, :]
        tl.store(out_ptr, out, mask=in_heads[:, None])
        tl.store(PartLse + row * stride_ln + heads * stride_lh + split, running_max + tl.log(running_sum),
                 mask=in_heads)


def mla_config(*, rows: int, heads: int, entry: int, page: int, width: int, dtype: torch.dtype,
               device: torch.device) -> DecodeConfig:
    """The tiles and splits for ``rows`` rows of ``heads`` heads over entries ``entry`` wide (static shapes only)."""
    return choose_config(rows=rows, heads=heads, kv_heads=triton.cdiv(heads, BLOCK_H), head_dim=entry, page=page,
                         width=width, dtype=dtype, sms=_sm_count(torch.device(device)))


def mla_decode_attention(*, q: torch.Tensor, latents: torch.Tensor, lengths: torch.Tensor, block_tables: torch.Tensor,
                         scale: float, rank: int, config: DecodeConfig | None = None) -> torch.Tensor:
    """``softmax(scale q [c | k_pe]^T) c`` for each of ``q``'s ``H`` heads ``[N, H, rank + rope]`` over the first
    ``lengths[n]`` cached entries of row ``n`` (``latents`` ``[blocks, B, rank + rope]``, ``block_tables`` ``[N, W]``);
    returns the heads' outputs in latent space ``[N, H, rank]``. Launches a fixed grid (graph-safe)."""
    rows, heads, entry = q.shape
    page = latents.shape[1]
    if latents.shape[2] != entry or not 0 < rank < entry or latents.stride(2) != 1 or q.stride(2) != 1:
        raise ValueError(f"MLA decode attention: q {tuple(q.shape)} and latents {tuple(latents.shape)} must share "
                         f"their last (contiguous) width, rank {rank} below it")
    if config is None:
        config = mla_config(rows=rows, heads=heads, entry=entry, page=page, width=block_tables.shape[1],
                            dtype=q.dtype, device=q.device)
    if config.split_len % config.block_n:
        raise ValueError(f"split_len {config.split_len} must be a multiple of block_n {config.block_n}")
    block_r = max(16, triton.next_power_of_2(rank))
    splits = config.splits(block_tables.shape[1] * page)
    direct = splits == 1
    out = torch.empty(rows, heads, block_r, dtype=q.dtype, device=q.device)
    part_out = out if direct else torch.empty(rows, heads, splits, block_r, dtype=torch.float32, device=q.device)
    part_lse = out if direct else torch.empty(rows, heads, splits, dtype=torch.float32, device=q.device)
    _mla_split_kernel[(rows, triton.cdiv(heads, BLOCK_H), splits)](
        q, latents, lengths, block_tables, part_out, part_lse, out, scale,
        q.stride(0), q.stride(1), latents.stride(0), latents.stride(1), block_tables.stride(0),
        part_out.stride(0), part_out.stride(1), part_out.stride(2) if not direct else 0, part_lse.stride(0),
        part_lse.stride(1), out.stride(0), out.stride(1),
        HEADS=heads, BLOCK_H=BLOCK_H, RANK=rank, BLOCK_R=block_r, ROPE=entry - rank,
        BLOCK_P=max(16, triton.next_power_of_2(entry - rank)), BLOCK_N=config.block_n, SPLIT_LEN=config.split_len,
        PAGE=page, PRECISION="ieee" if q.dtype == torch.float32 else "tf32", NUM_STAGES=config.num_stages,
        DIRECT=direct, INTERPRETED=_INTERPRETED, num_warps=config.num_warps, num_stages=config.num_stages,
    )
    if not direct:
        _combine_kernel[(rows, heads)](
            part_out, part_lse, out, lengths, part_lse, NO_WINDOW, part_out.stride(0), part_out.stride(1),
            part_out.stride(2), part_lse.stride(0), part_lse.stride(1), out.stride(0), out.stride(1),
            HEAD_DIM=block_r, SPLITS=triton.next_power_of_2(splits), SPLIT_LEN=config.split_len, SINKS=False,
        )
    return out[..., :rank]

"""Decode attention over the paged KV cache as two Triton kernels (CUDA only): split-K, per-row lengths and blocks.

A decode step's attention is bound by reading keys and values: each live row reads its own
``length`` positions of every KV head, nothing more. SDPA over the cache cannot do that
inside a static-shape step: its key span is one number for the whole batch, so every row would
read up to the longest row's length (the nano-vllm workload's rows range from 100 to 2048
tokens: about twice the bytes), and over a paged cache it needs the blocks gathered first. These
kernels read the lengths and the block tables from the device and load each key where its block
lies, so the step keeps static shapes (CUDA graphs) and reads only each row's live keys, once.

Flash-decoding (Dao et al. 2023, "Flash-Decoding for long-context inference"): the context of
row ``n`` is cut into splits of :data:`SPLIT_LEN` positions; program ``(n, kv_head, split)``
computes, for the ``G = H / KV`` query heads that share that KV head (grouped-query attention,
no ``repeat_kv`` copy), the softmax-weighted values of its split and their log-sum-exp
``lse_s``; a second kernel combines the splits: ``out = sum_s exp(lse_s - lse) * out_s`` with
``lse = log sum_s exp(lse_s)``. Splits past the row's length do no work.

Shapes: ``q`` ``[N, H, D]``; ``keys`` / ``values`` ``[KV, blocks, B, D]`` (one layer of
:class:`~hybridflow.rollout.kv_cache.PagedKVCache`); ``block_tables`` ``[N, W]`` int32 (position ``p`` of
row ``n`` is at block ``block_tables[n, p // B]``, offset ``p % B``); ``lengths`` ``[N]`` int; returns
``[N, H, D]`` in ``q``'s dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SPLIT_LEN = 256
"""Positions per split: 256 rows x 8 KV heads x 8 splits of a 2k context is ~16k programs."""
BLOCK_N = 64
"""Keys loaded per inner iteration."""


@triton.jit
def _split_kernel(Q, K, V, Lengths, Tables, PartOut, PartLse, scale, window, softcap,
                  stride_qn, stride_qh, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
                  stride_tn, stride_pn, stride_ph, stride_ps, stride_ln, stride_lh,
                  GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                  SPLIT_LEN: tl.constexpr, PAGE: tl.constexpr, PRECISION: tl.constexpr, SOFTCAP: tl.constexpr):
    row, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    length = tl.load(Lengths + row).to(tl.int32)
    first = _window_start(length, window)
    start = split * SPLIT_LEN
    if start >= length or start + SPLIT_LEN <= first:
        return  # the combine kernel never reads this split
    group = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + group
    in_group = group < GROUP
    q = tl.load(Q + row * stride_qn + heads[:, None] * stride_qh + dims[None, :], mask=in_group[:, None], other=0.0)
    k_base = K + kv_head * stride_kh
    v_base = V + kv_head * stride_vh
    table = Tables + row * stride_tn
    running_max = tl.full([BLOCK_G], float("-inf"), tl.float32)
    running_sum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    end = tl.minimum(start + SPLIT_LEN, length)
    for block in tl.static_range(SPLIT_LEN // BLOCK_N):  # blocks past `end` load nothing (masked)
        positions = start + block * BLOCK_N + tl.arange(0, BLOCK_N)
        live = (positions < end) & (positions >= first)
        blocks = tl.load(table + positions // PAGE, mask=live, other=0).to(tl.int64)
        offsets = positions % PAGE
        k = tl.load(k_base + blocks[:, None] * stride_kb + offsets[:, None] * stride_kt + dims[None, :],
                    mask=live[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        if SOFTCAP:  # Gemma 2: c tanh(s / c), tanh(x) = 2 sigmoid(2x) - 1 (saturates to +-1, no inf / inf)
            scores = softcap * (2.0 * tl.sigmoid(scores * (2.0 / softcap)) - 1.0)
        scores = tl.where(live[None, :], scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, 1))
        # A block wholly before the window start leaves the max at -inf: subtract 0 there, not -inf (NaN).
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        rescale = tl.exp(running_max - shift)
        weights = tl.exp(scores - shift[:, None])
        running_sum = running_sum * rescale + tl.sum(weights, 1)
        v = tl.load(v_base + blocks[:, None] * stride_vb + offsets[:, None] * stride_vt + dims[None, :],
                    mask=live[:, None], other=0.0)
        acc = acc * rescale[:, None] + tl.dot(weights.to(v.dtype), v, input_precision=PRECISION)
        running_max = new_max
    out_ptr = PartOut + row * stride_pn + heads[:, None] * stride_ph + split * stride_ps + dims[None, :]
    tl.store(out_ptr, acc / running_sum[:, None], mask=in_group[:, None])
    tl.store(PartLse + row * stride_ln + heads * stride_lh + split, running_max + tl.log(running_sum), mask=in_group)


@triton.jit
def _window_start(length, window):
    """The first position a row of ``length`` keys attends to: ``length - window`` with a window (> 0), else 0."""
    return tl.where(window > 0, tl.maximum(length - window, 0), 0)


@triton.jit
def _combine_kernel(PartOut, PartLse, Out, Lengths, window, stride_pn, stride_ph, stride_ps, stride_ln, stride_lh,
                    stride_on, stride_oh, HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr, SPLIT_LEN: tl.constexpr):
    row, head = tl.program_id(0), tl.program_id(1)
    length = tl.load(Lengths + row).to(tl.int32)
    splits = tl.arange(0, SPLITS)
    dims = tl.arange(0, HEAD_DIM)
    first = _window_start(length, window)
    used = (splits * SPLIT_LEN < length) & ((splits + 1) * SPLIT_LEN > first)  # never read a split not written
    lse = tl.load(PartLse + row * stride_ln + head * stride_lh + splits, mask=used, other=float("-inf"))
    weights = tl.exp(lse - tl.max(lse, 0))
    weights = weights / tl.sum(weights, 0)
    parts = tl.load(PartOut + row * stride_pn + head * stride_ph + splits[:, None] * stride_ps + dims[None, :],
                    mask=used[:, None], other=0.0)
    out = tl.sum(parts * weights[:, None], 0)
    tl.store(Out + row * stride_on + head * stride_oh + dims, out.to(Out.dtype.element_ty))


def supported(*, head_dim: int, device: torch.device) -> bool:
    """Whether these kernels run here: CUDA, and a power-of-two head size (``tl.arange``)."""
    return torch.device(device).type == "cuda" and head_dim >= 16 and head_dim & (head_dim - 1) == 0


def paged_decode_attention(*, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor,
                           scale: float, block_tables: torch.Tensor, window: int | None = None,
                           softcap: float | None = None) -> torch.Tensor:
    """``softmax(cap(scale q k^T)) v``: attention of ``q`` ``[N, H, D]`` over the first ``lengths[n]`` positions of
    row ``n``'s blocks (``block_tables`` ``[N, W]``, ``keys`` / ``values`` ``[KV, blocks, B, D]``; with a sliding
    ``window``, only the last ``window`` of them: splits wholly before the window are skipped), ``cap(s) = c tanh(s /
    c)`` with a ``softcap`` ``c`` (Gemma 2), else ``s``; returns ``[N, H, D]``.
    Launches a fixed grid (graph-safe)."""
    if softcap is not None and softcap <= 0:
        raise ValueError(f"softcap must be > 0 (or None for no cap), got {softcap}")
    rows, heads, head_dim = q.shape
    kv_heads, page = keys.shape[0], keys.shape[2]
    group = heads // kv_heads
    splits = triton.cdiv(block_tables.shape[1] * page, SPLIT_LEN)
    part_out = torch.empty(rows, heads, splits, head_dim, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(rows, heads, splits, dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"  # tf32 applies to fp32 operands only
    _split_kernel[(rows, kv_heads, splits)](
        q, keys, values, lengths, block_tables, part_out, part_lse, scale, window or 0, softcap or 1.0,
        q.stride(0), q.stride(1), keys.stride(1), keys.stride(0), keys.stride(2),
        values.stride(1), values.stride(0), values.stride(2), block_tables.stride(0),
        part_out.stride(0), part_out.stride(1), part_out.stride(2), part_lse.stride(0), part_lse.stride(1),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim, BLOCK_N=BLOCK_N,
        SPLIT_LEN=SPLIT_LEN, PAGE=page, PRECISION=precision, SOFTCAP=softcap is not None,
    )
    _combine_kernel[(rows, heads)](
        part_out, part_lse, out, lengths, window or 0, part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1), out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, SPLITS=triton.next_power_of_2(splits), SPLIT_LEN=SPLIT_LEN,
    )
    return out

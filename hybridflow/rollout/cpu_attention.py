"""Decode attention over the paged KV cache on CPU: a small C kernel, compiled on this machine at first use.

Why: a CPU decode step's attention is bound by reading keys and values. SDPA over the cache can only read one
key span for the whole batch, so every row reads up to the longest row's length (about 1.5x the live bytes
in an RL batch, where rows are at very different positions), it needs a contiguous layout (the pool's
blocks gathered every layer, or a slot-layout mirror kept beside the pool, twice the KV memory), and with
3 query heads per KV head its small matmuls ran at ~40 % of the bandwidth a plain sum reaches.
``csrc/paged_decode_attention.c`` reads each row's own positions through its block table, once, straight
from the pool: the same contract as the CUDA kernels of :mod:`hybridflow.rollout.triton_attention`.

Built with the other CPU kernels (:mod:`hybridflow.rollout.cpu_kernels`): where they are not (no compiler, or
``HYBRIDFLOW_CPU_KERNELS=torch``), and for head dims not a multiple of 16, the engine runs SDPA over a slot mirror
instead (same outputs to fp32 rounding, slower; the tests run both paths on every machine). A bf16 pool (the engine's
dtype on a CPU with bf16 units) is read in place by the kernel's bf16 twin: half the bytes, each key and value widened to
fp32 in registers (scores by AVX-512-BF16's vdpbf16ps where the build has it), fp32 sums and an online softmax.
"""

from __future__ import annotations

import torch

from hybridflow.rollout.cpu_kernels import library

LANES = 16
"""The kernel reads head dims 16 floats at a time: ``head_dim`` must be a multiple (64, 128, 256 are)."""
MAX_GROUP = 16
"""Most query heads per KV head the kernel takes."""
KERNEL_DTYPES = {torch.float32: "paged_decode_attention_f32", torch.bfloat16: "paged_decode_attention_bf16"}
"""The kernel for each dtype of the pool (q and the output share it; issue 56: bf16 beside fp32)."""


def supports(*, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int) -> bool:
    """Whether decode attention for this model can run as the kernel (fp32 or bf16, head dims in 16s, at most 16
    query heads per KV head) and the kernel is built."""
    shaped = dtype in KERNEL_DTYPES and head_dim % LANES == 0 and heads // kv_heads <= MAX_GROUP
    return shaped and library() is not None


def paged_decode_attention(*, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, block_tables: torch.Tensor,
                           lengths: torch.Tensor, scale: float, window: int | None,
                           softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """``softmax(cap(scale q k^T)) v`` of each row over its first ``lengths[n]`` positions (the last ``window`` of
    them with a window), ``cap(s) = c tanh(s / c)`` with a ``softcap`` ``c`` (Gemma 2), else ``s``; ``sinks`` ``[H]``
    (gpt-oss): one more logit per head in the softmax, dropped after it.

    Args:
        q: ``[N, H, D]`` queries, fp32 or bf16.
        keys, values: ``[KV, blocks, B, D]``, one layer of the pool (:meth:`PagedKVCache.layer`), in ``q``'s dtype.
        block_tables: ``[N, W]`` int32; a view with unit column stride (a slice of the engine's table).
        lengths: ``[N]`` int64, each row's cached positions (its position + 1).

    Returns:
        ``[N, H, D]``.
    """
    rows, heads, head_dim = q.shape
    kv_heads, blocks, block_size, _ = keys.shape
    if q.dtype not in KERNEL_DTYPES or keys.dtype != q.dtype or values.dtype != q.dtype:
        raise ValueError(f"paged decode attention: q {q.dtype}, keys {keys.dtype}, values {values.dtype}: the kernel "
                         "takes them all fp32 or all bf16")
    q, keys, values, lengths = q.contiguous(), keys.contiguous(), values.contiguous(), lengths.contiguous()
    if block_tables.stride(1) != 1 or block_tables.dtype != torch.int32:
        block_tables = block_tables.to(torch.int32).contiguous()
    out = torch.empty_like(q)
    if sinks is not None:
        sinks = sinks.to(torch.float32).contiguous()
        if sinks.shape != (heads,):
            raise ValueError(f"paged decode attention: sinks of shape {tuple(sinks.shape)}, expected ({heads},)")
    failed = getattr(library(), KERNEL_DTYPES[q.dtype])(
        q.data_ptr(), keys.data_ptr(), values.data_ptr(), block_tables.data_ptr(), block_tables.stride(0),
        lengths.data_ptr(), out.data_ptr(), rows, heads, kv_heads, head_dim, blocks, block_size,
        block_tables.shape[1] * block_size, scale, softcap or 0.0, None if sinks is None else sinks.data_ptr(),
        window or 0, torch.get_num_threads())
    if failed:
        raise RuntimeError(f"paged decode attention refused its inputs (heads {heads}, KV heads {kv_heads}, head dim "
                           f"{head_dim}, longest row {int(lengths.max())} of {block_tables.shape[1] * block_size})")
    return out

"""Decode attention over the paged KV cache on CPU: a small C kernel, compiled on this machine at first use.

Why: a CPU decode step's attention is bound by reading keys and values. SDPA over the cache can only read one
key span for the whole batch, so every row reads up to the longest row's length (about 1.5x the live bytes
in an RL batch, where rows are at very different positions), it needs a contiguous layout (the pool's
blocks gathered every layer, or a slot-layout mirror kept beside the pool, twice the KV memory), and with
3 query heads per KV head its small matmuls ran at ~40 % of the bandwidth a plain sum reaches.
``csrc/paged_decode_attention.c`` reads each row's own positions through its block table, once, straight
from the pool: the same contract as the CUDA kernels of :mod:`hybridflow.rollout.triton_attention`.

Build: ``gcc -O3 -march=native`` (the instruction set of the machine it runs on: AVX2 or AVX-512 alike, no
intrinsics; ``HYBRIDFLOW_KERNEL_MARCH`` picks another), cached under ``$HYBRIDFLOW_CACHE/kernels`` (default
``~/.cache/hybridflow/kernels``) by a hash of the source, the flags, the compiler and the CPU's flags, written
atomically. Where no compiler is found or the build fails, :func:`kernel` returns ``None`` after saying why once,
and the engine runs SDPA over a slot mirror instead, as it does for bf16 and head dims not a multiple of 16 (same
outputs to fp32 rounding, slower). ``HYBRIDFLOW_CPU_ATTENTION=torch`` forces that fallback (the tests run both
paths on every machine).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from hybridflow.cpu import cpu_flags
from hybridflow.models.default_model import cache_root

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "paged_decode_attention.c"
FLAGS = ("-O3", "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros", "-fopenmp",
         "-Wno-psabi", "-shared", "-fPIC")
"""Beside ``-march``: ``-fno-trapping-math`` lets the exp and floor loops vectorise (nothing here traps);
``-fassociative-math`` (with ``-fno-signed-zeros``, which it needs) lets the dot products and sums run in vector
lanes, reduced in registers: the order of an fp32 sum changes, as SDPA's own blocking does (1.63-1.76x ->
1.36-1.53x the time of a plain sum over the same bytes). Infinities and NaNs keep their meaning (no
``-ffinite-math-only``); ``-fopenmp`` links the OpenMP runtime torch already loaded (one thread pool);
``-Wno-psabi``: on AVX2 gcc notes that a 16-float vector passes differently without AVX-512, which concerns no
call outside this file."""
MARCH = "HYBRIDFLOW_KERNEL_MARCH"
"""``-march`` of the build: ``native`` (default, the machine it runs on), or e.g. ``haswell`` to build the AVX2 code
an AVX2-only machine gets (a test builds that one too; benchmarks emulate an AVX2 machine with it, beside
``ATEN_CPU_CAPABILITY=avx2`` and ``ONEDNN_MAX_CPU_ISA=AVX2``)."""
FORCE_FALLBACK = "HYBRIDFLOW_CPU_ATTENTION"
LANES = 16
"""The kernel reads head dims 16 floats at a time: ``head_dim`` must be a multiple (64, 128, 256 are)."""
MAX_GROUP = 16
"""Most query heads per KV head the kernel takes."""


def build_flags() -> tuple[str, ...]:
    return (f"-march={os.environ.get(MARCH) or 'native'}", *FLAGS)


def _build(compiler: str) -> Path:
    """The shared library for this source, flags, compiler and CPU: built unless already cached."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    flags = build_flags()
    key = hashlib.sha256("\0".join([SOURCE.read_text(), " ".join(flags), version, " ".join(cpu_flags())]).encode())
    target = cache_root() / "kernels" / f"paged_decode_attention-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        subprocess.run([compiler, *flags, "-o", str(built), str(SOURCE), "-lm"], capture_output=True, text=True,
                       check=True)
        os.replace(built, target)  # atomic: a concurrent process sees the old state or the whole library
    return target


@functools.cache
def kernel() -> ctypes.CDLL | None:
    """The loaded kernel, or ``None`` (forced off, no compiler, or the build failed: said once)."""
    if os.environ.get(FORCE_FALLBACK, "").lower() == "torch":
        return None
    compiler = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if compiler is None:
        logger.warning("no C compiler (gcc or $CC) found: CPU decode attention runs SDPA over a slot mirror "
                       "(slower, twice the KV memory); install gcc to build the paged kernel")
        return None
    try:
        library = ctypes.CDLL(str(_build(compiler)))
    except (OSError, subprocess.CalledProcessError) as err:
        detail = getattr(err, "stderr", "") or str(err)
        logger.warning("the CPU paged-attention kernel did not build (%s): decode attention runs SDPA over a "
                       "slot mirror instead (slower)", detail.strip().splitlines()[-1] if detail.strip() else err)
        return None
    function = library.paged_decode_attention_f32
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    function.argtypes = [pointer, pointer, pointer, pointer, size, pointer, pointer, size, size, size, size, size,
                         size, size, ctypes.c_float, ctypes.c_float, size, ctypes.c_int]
    function.restype = ctypes.c_int
    return library


def supports(*, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int) -> bool:
    """Whether decode attention for this model can run as the kernel (fp32, head dims in 16s, at most 16 query
    heads per KV head) and the kernel is built."""
    shaped = dtype == torch.float32 and head_dim % LANES == 0 and heads // kv_heads <= MAX_GROUP
    return shaped and kernel() is not None


def paged_decode_attention(*, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, block_tables: torch.Tensor,
                           lengths: torch.Tensor, scale: float, window: int | None,
                           softcap: float | None = None) -> torch.Tensor:
    """``softmax(cap(scale q k^T)) v`` of each row over its first ``lengths[n]`` positions (the last ``window`` of
    them with a window), ``cap(s) = c tanh(s / c)`` with a ``softcap`` ``c`` (Gemma 2), else ``s``.

    Args:
        q: ``[N, H, D]`` fp32 queries.
        keys, values: ``[KV, blocks, B, D]``, one layer of the pool (:meth:`PagedKVCache.layer`).
        block_tables: ``[N, W]`` int32; a view with unit column stride (a slice of the engine's table).
        lengths: ``[N]`` int64, each row's cached positions (its position + 1).

    Returns:
        ``[N, H, D]``.
    """
    rows, heads, head_dim = q.shape
    kv_heads, blocks, block_size, _ = keys.shape
    q, keys, values, lengths = q.contiguous(), keys.contiguous(), values.contiguous(), lengths.contiguous()
    if block_tables.stride(1) != 1 or block_tables.dtype != torch.int32:
        block_tables = block_tables.to(torch.int32).contiguous()
    out = torch.empty_like(q)
    failed = kernel().paged_decode_attention_f32(
        q.data_ptr(), keys.data_ptr(), values.data_ptr(), block_tables.data_ptr(), block_tables.stride(0),
        lengths.data_ptr(), out.data_ptr(), rows, heads, kv_heads, head_dim, blocks, block_size,
        block_tables.shape[1] * block_size, scale, softcap or 0.0, window or 0, torch.get_num_threads())
    if failed:
        raise RuntimeError(f"paged decode attention refused its inputs (heads {heads}, KV heads {kv_heads}, head dim "
                           f"{head_dim}, longest row {int(lengths.max())} of {block_tables.shape[1] * block_size})")
    return out

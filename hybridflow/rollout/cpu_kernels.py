"""The CPU decode kernels: the C sources of ``csrc/``, compiled on this machine at first use into one library.

What is in it: decode attention over the paged pool (:mod:`hybridflow.rollout.cpu_attention`), the decode step's
small ops fused per layer and the one-pass sampler (:mod:`hybridflow.rollout.cpu_fused`), a mixture-of-experts
layer's routed experts (:mod:`hybridflow.rollout.cpu_moe`), bf16 projections at decode row counts
(:mod:`hybridflow.rollout.bf16_linear`, AVX-512-BF16 builds only) and fp32 ones
(:mod:`hybridflow.rollout.fp32_linear`, AVX-512F builds only). Each exists because the
torch ops it replaces cost several times what the machine needs for the same bytes (docs/benchmarks.md).

Build: ``gcc -O3 -march=native`` (the instruction set of the machine it runs on: AVX2 or AVX-512 alike, written as
gcc vectors, no intrinsics but one: the bf16 attention's vdpbf16ps, compiled only where ``-march`` has AVX-512-BF16;
``HYBRIDFLOW_KERNEL_MARCH`` picks another), cached under ``$HYBRIDFLOW_CACHE/kernels`` (default
``~/.cache/hybridflow/kernels``) by a hash of the sources, the flags, the compiler and the CPU's flags, written
atomically. Where no compiler is found or the build fails, :func:`library` returns ``None`` after saying why once,
and the engine runs torch ops instead: SDPA over a slot mirror for attention, the eager layer and sampler for the
rest (same outputs to fp32 rounding, slower), as it does for head dims not a multiple of 16. The decode step's
kernels take fp32 or bf16 tensors (``_f32`` / ``_bf16``: a bf16 twin computes in fp32 and rounds once on the way out);
the sampler takes fp32 logits.
``HYBRIDFLOW_CPU_KERNELS=torch`` forces that fallback (the tests run both paths on every machine).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from pathlib import Path

from hybridflow.cpu import KERNEL_MARCH_ENV, kernel_march_flag, load_c_library
from hybridflow.models.default_model import cache_root

logger = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
SOURCES = tuple(sorted(CSRC.glob("*.c")))
"""Compiled together into one library; with the headers beside them they make the build's cache key."""
FLAGS = ("-O3", "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros", "-fopenmp",
         "-Wno-psabi", "-shared", "-fPIC")
"""Beside ``-march``: ``-fno-trapping-math`` lets the exp and floor loops vectorise (nothing here traps);
``-fassociative-math`` (with ``-fno-signed-zeros``, which it needs) lets the dot products and sums run in vector
lanes, reduced in registers: the order of an fp32 sum changes, as SDPA's own blocking does (attention: 1.63-1.76x
-> 1.36-1.53x the time of a plain sum over the same bytes). Infinities and NaNs keep their meaning (no
``-ffinite-math-only``); ``-fopenmp`` links the OpenMP runtime torch already loaded (one thread pool);
``-Wno-psabi``: on AVX2 gcc notes that a 16-float vector passes differently without AVX-512, which concerns no
call outside these files."""
MARCH = KERNEL_MARCH_ENV
"""``-march`` of the build: ``native`` (default, the machine it runs on), or e.g. ``haswell`` to build the AVX2 code
an AVX2-only machine gets (a test builds that one too; benchmarks emulate an AVX2 machine with it, beside
``ATEN_CPU_CAPABILITY=avx2`` and ``ONEDNN_MAX_CPU_ISA=AVX2``)."""
FORCE_FALLBACK = "HYBRIDFLOW_CPU_KERNELS"
"""Set to ``torch`` to run the torch ops these kernels replace (read when the library is first asked for)."""

_POINTER, _SIZE = ctypes.c_void_p, ctypes.c_int64
SIGNATURES = {
    "paged_decode_attention_f32": [_POINTER] * 4 + [_SIZE] + [_POINTER] * 2 + [_SIZE] * 7
    + [ctypes.c_float] * 2 + [_POINTER, _SIZE, ctypes.c_int],
    "add_rms_norm_f32": [_POINTER] * 5 + [_SIZE] * 2 + [ctypes.c_float, ctypes.c_int],
    "qkv_rope_write_f32": [_POINTER] * 9 + [_SIZE] * 2 + [_POINTER] + [_SIZE] * 7 + [ctypes.c_float, ctypes.c_int],
    "silu_mul_f32": [_POINTER] * 2 + [_SIZE] * 2,
    "gelu_tanh_mul_f32": [_POINTER] * 2 + [_SIZE] * 2,
    "sample_rows_f32": [_POINTER] * 6 + [_SIZE] * 2 + [ctypes.c_int],
    # issue 56: the bf16 twins of the decode step's kernels (same arguments)
    "paged_decode_attention_bf16": [_POINTER] * 4 + [_SIZE] + [_POINTER] * 2 + [_SIZE] * 7
    + [ctypes.c_float] * 2 + [_POINTER, _SIZE, ctypes.c_int],
    "add_rms_norm_bf16": [_POINTER] * 5 + [_SIZE] * 2 + [ctypes.c_float, ctypes.c_int],
    "qkv_rope_write_bf16": [_POINTER] * 9 + [_SIZE] * 2 + [_POINTER] + [_SIZE] * 7 + [ctypes.c_float] + [ctypes.c_int] * 2,
    "silu_mul_bf16": [_POINTER] * 2 + [_SIZE] * 2,
    "gelu_tanh_mul_bf16": [_POINTER] * 2 + [_SIZE] * 2,
    "paged_decode_attention_bf16_dot_units": [],  # issue 56: 1 where the build scores with vdpbf16ps
    "moe_experts_f32": [_POINTER] * 3 + [_SIZE] * 2 + [_POINTER] * 4 + [_SIZE] * 3 + [ctypes.c_int]
    + [ctypes.c_float] * 2 + [_POINTER, ctypes.c_int],
    # issue 56 (decode matmul): bf16 projections at decode row counts (hybridflow/rollout/bf16_linear.py)
    "bf16_linear_supported": [],
    "bf16_linear": [_POINTER, _SIZE, _SIZE, _SIZE, _POINTER, _SIZE, _POINTER, _POINTER, _SIZE, ctypes.c_int,
                    ctypes.c_int],
    # issue 56 (fp32 decode matmul): its fp32 twin, AVX-512F builds (hybridflow/rollout/fp32_linear.py)
    "fp32_linear_supported": [],
    "fp32_linear": [_POINTER, _SIZE, _SIZE, _SIZE, _POINTER, _SIZE, _POINTER, _POINTER, _SIZE, ctypes.c_int,
                    ctypes.c_int],
}
"""Each exported function's argument types (every one returns an ``int``: 0, or -1 for inputs it refuses)."""


def build_flags() -> tuple[str, ...]:
    return (kernel_march_flag(), *FLAGS)


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernels, or ``None`` (forced off, no compiler, or the build failed: said once)."""
    if os.environ.get(FORCE_FALLBACK, "").lower() == "torch":
        return None
    return load_c_library(
        CSRC, "hybridflow_cpu", build_flags(), cache_root() / "kernels", SIGNATURES, logger=logger,
        no_compiler="no C compiler (gcc or $CC) found: the CPU decode step runs torch ops (slower; attention then "
        "reads a slot mirror, twice the KV memory); install gcc to build the kernels",
        failed="the CPU decode kernels did not build (%s): the decode step runs torch ops instead (slower; attention "
        "over a slot mirror)")

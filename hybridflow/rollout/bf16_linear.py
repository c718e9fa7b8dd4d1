"""bf16 ``y = x W^T + b`` at decode row counts: the AVX-512-BF16 kernel of ``csrc/bf16_linear.c`` (issue 56).

At a decode step's 16-64 rows oneDNN's packed bf16 matmul reads the weights at a fraction of the machine's rate
(docs/benchmarks.md); this kernel reads each packed weight panel once per call for all rows, multiplying pairs of
bf16 with ``vdpbf16ps`` into fp32 sums and rounding once on the way out (to nearest even).

:func:`pack` lays a ``[N, K]`` weight out once (after every weight change) as panels of :data:`PANEL` columns,
``[K2, PANEL, 2]`` each (``K2 = ceil(K / 2)``, zeros past ``N`` and ``K``); :func:`linear` multiplies by it.
:func:`unavailable_reason` says why the kernel cannot run here (``None``: it can): the library is not built, the
build has no AVX-512-BF16 (``-march`` of a CPU without it: the C functions refuse), or a probe multiply is wrong.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hybridflow.rollout import cpu_kernels

PANEL = 48
"""Output columns of one packed panel (three 16-lane fp32 accumulators a row; matches ``PANEL`` in the C source)."""


def missing_build_reason() -> str | None:
    """``None`` where the library holds the kernel, else why not (no library, or a build without AVX-512-BF16)."""
    library = cpu_kernels.library()
    if library is None:
        return "the CPU decode kernels are not built"
    if not library.bf16_linear_supported():
        return "no AVX-512-BF16 in this CPU's kernel build"
    return None


@functools.cache
def unavailable_reason() -> str | None:
    """``None`` where the kernel runs on this CPU, else one line saying why not (built, and a probe multiply is
    right; probed once)."""
    missing = missing_build_reason()
    if missing is not None:
        return missing
    generator = torch.Generator().manual_seed(0)
    weight = torch.randint(-4, 5, (50, 7), generator=generator).bfloat16()  # small integers: every sum exact
    x = torch.randint(-4, 5, (9, 7), generator=generator).bfloat16()
    bias = torch.arange(50, dtype=torch.float32)
    expected = x.double() @ weight.double().T + bias.double()
    if not torch.equal(linear(x, pack(weight), bias, out_dtype=torch.float32).double(), expected):
        return "the bf16 kernel gave a wrong result on the probe"
    return None


@dataclass(frozen=True)
class PackedWeight:
    """A ``[N, K]`` weight as the kernel reads it: ``panels`` ``[ceil(N / PANEL), ceil(K / 2), PANEL, 2]`` bf16."""

    panels: torch.Tensor
    n: int
    k: int


def pack(weight: torch.Tensor) -> PackedWeight:
    """``[N, K]`` -> the kernel's panels (a new bf16 tensor: later changes to ``weight`` need a new pack)."""
    n, k = weight.shape
    with torch.no_grad():
        padded = F.pad(weight.detach().to(torch.bfloat16), (0, k % 2, 0, -n % PANEL))
        panels = padded.view(-1, PANEL, (k + 1) // 2, 2).permute(0, 2, 1, 3).contiguous()
    return PackedWeight(panels, n, k)


def linear(x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None = None, *,
           out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``[..., K]`` bf16 times the packed ``[N, K]`` weight (+ ``bias``, fp32 ``[N]``) -> ``[..., N]`` in
    ``out_dtype`` (bf16, rounded once, or fp32), on ``torch.get_num_threads()`` threads."""
    n, k = packed.n, packed.k
    if x.dtype != torch.bfloat16 or x.shape[-1] != k:
        raise ValueError(f"bf16_linear takes bf16 inputs [..., {k}], got {x.dtype} {tuple(x.shape)}")
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"bf16_linear writes bf16 or float32, not {out_dtype}")
    rows = x.reshape(-1, k)
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    y = torch.empty(rows.shape[0], n, dtype=out_dtype)
    bias_pointer = None if bias is None else bias.data_ptr()
    status = cpu_kernels.library().bf16_linear(rows.data_ptr(), rows.shape[0], k, rows.stride(0),
                                               packed.panels.data_ptr(), n, bias_pointer, y.data_ptr(), n,
                                               int(out_dtype == torch.float32), torch.get_num_threads())
    if status != 0:
        raise RuntimeError(f"bf16_linear refused [{rows.shape[0]}, {k}] x [{n}, {k}] (no AVX-512-BF16 in the build?)")
    return y.view(*x.shape[:-1], n)

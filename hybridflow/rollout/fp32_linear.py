"""fp32 ``y = x W^T + b`` at decode row counts: the AVX-512F kernel of ``csrc/fp32_linear.c`` (issue 56), the fp32
twin of :mod:`hybridflow.rollout.bf16_linear` (same panels, packing, probe and call; this module names them).

At a decode step's 16 rows oneDNN's packed fp32 matmul reads the weights at about half the machine's rate
(docs/benchmarks.md); this kernel reads each packed panel once per block of 8 rows, one fused multiply-add per
16 columns and k. :func:`unavailable_reason` says why it cannot run here (``None``: it can): no library, a build
without AVX-512F (an AVX2 machine: the C functions refuse), or a probe multiply is wrong.
"""

from __future__ import annotations

import functools

import torch

from hybridflow.rollout import bf16_linear
from hybridflow.rollout.bf16_linear import PackedWeight


def missing_build_reason() -> str | None:
    """``None`` where the library holds the kernel, else why not (no library, or a build without AVX-512F)."""
    return bf16_linear.missing_build_reason(torch.float32)


@functools.cache
def unavailable_reason() -> str | None:
    """``None`` where the kernel runs on this CPU, else one line saying why not (probed once)."""
    return missing_build_reason() or bf16_linear.probe_reason(torch.float32)


def pack(weight: torch.Tensor, *, into: PackedWeight | None = None) -> PackedWeight:
    """``[N, K]`` -> fp32 panels ``[ceil(N / 48), K, 48, 1]`` (a new tensor, or over ``into``'s: repack after a weight
    change)."""
    return bf16_linear.pack(weight, torch.float32, into=into)


def linear(x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``[..., K]`` fp32 times the packed weight (+ ``bias``, fp32 ``[N]``) -> ``[..., N]`` fp32."""
    return bf16_linear.linear(x, packed, bias, out_dtype=torch.float32)

"""bf16 ``y = x W^T + b`` at decode row counts: the AVX-512-BF16 kernel of ``csrc/bf16_linear.c`` (issue 56).

At a decode step's 16-64 rows oneDNN's packed bf16 matmul reads the weights at a fraction of the machine's rate
(docs/benchmarks.md); this kernel reads each packed weight panel once per call for all rows, multiplying pairs of
bf16 with ``vdpbf16ps`` into fp32 sums and rounding once on the way out (to nearest even).

:func:`pack` lays a ``[N, K]`` weight out once (after every weight change) as panels of :data:`PANEL` columns,
``[K2, PANEL, 2]`` each (``K2 = ceil(K / 2)``, zeros past ``N`` and ``K``); :func:`linear` multiplies by it.
The fp32 twin (``csrc/fp32_linear.c``, :mod:`hybridflow.rollout.fp32_linear`) shares :func:`pack` (``dtype``),
:func:`probe_reason` and :func:`linear`, which dispatch on the packed weight's dtype.
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
CHUNK_ROWS = 128
"""Rows per kernel call: more rows (prefill) are multiplied a chunk at a time, so that one chunk of ``x`` stays in
cache while every panel streams past it (unchunked, each panel re-reads all of ``x``: 3-7% slower at 2048 rows)."""


def missing_build_reason(dtype: torch.dtype = torch.bfloat16) -> str | None:
    """``None`` where the library holds the ``dtype`` kernel, else why not (no library, or a build without its ISA:
    AVX-512-BF16 for bf16, AVX-512F for fp32)."""
    library = cpu_kernels.library()
    if library is None:
        return "the CPU decode kernels are not built"
    form = _FORMATS[dtype]
    if not getattr(library, f"{form.function}_supported")():
        return f"no {form.isa} in this CPU's kernel build"
    return None


@functools.cache
def unavailable_reason() -> str | None:
    """``None`` where the kernel runs on this CPU, else one line saying why not (built, and a probe multiply is
    right; probed once)."""
    return missing_build_reason() or probe_reason(torch.bfloat16)


def probe_reason(dtype: torch.dtype) -> str | None:
    """``None`` where the ``dtype`` kernel multiplies a small integer probe exactly (K and N tails, bias), else why."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randint(-4, 5, (50, 7), generator=generator).to(dtype)  # small integers: every sum exact
    x = torch.randint(-4, 5, (9, 7), generator=generator).to(dtype)
    bias = torch.arange(50, dtype=torch.float32)
    expected = x.double() @ weight.double().T + bias.double()
    if not torch.equal(linear(x, pack(weight, dtype), bias, out_dtype=torch.float32).double(), expected):
        return f"the {_FORMATS[dtype].name} kernel gave a wrong result on the probe"
    return None


@dataclass(frozen=True)
class PackedWeight:
    """A ``[N, K]`` weight as the kernel reads it: ``panels`` ``[ceil(N / PANEL), ceil(K / 2), PANEL, 2]`` bf16
    (fp32: ``[ceil(N / PANEL), K, PANEL, 1]``)."""

    panels: torch.Tensor
    n: int
    k: int


@dataclass(frozen=True)
class _Format:
    name: str  # in messages
    group: int  # k per 32-bit lane of a panel
    function: str  # the C function (and ``<function>_supported``, whether the build has it)
    isa: str  # what the build needs, in messages


_FORMATS = {torch.bfloat16: _Format("bf16", 2, "bf16_linear", "AVX-512-BF16"),
            torch.float32: _Format("fp32", 1, "fp32_linear", "AVX-512F")}  # fp32: csrc/fp32_linear.c (AVX-512F builds)


def pack(weight: torch.Tensor, dtype: torch.dtype = torch.bfloat16, *, into: PackedWeight | None = None) -> PackedWeight:
    """``[N, K]`` -> the ``dtype`` kernel's panels (a new tensor: later changes to ``weight`` need a new pack), or
    written over ``into``'s panels (same ``N``, ``K`` and dtype: no fresh memory to fault in) and ``into`` returned."""
    n, k = weight.shape
    group = _FORMATS[dtype].group
    with torch.no_grad():
        source = weight.detach().to(dtype)
        if n % PANEL or k % group:  # SmolLM2's shapes need no padding: no copy here
            source = F.pad(source, (0, -k % group, 0, -n % PANEL))
        if into is None:
            panels = torch.empty(-(-n // PANEL), -(-k // group), PANEL, group, dtype=dtype)
        elif (into.n, into.k, into.panels.dtype) != (n, k, dtype):
            raise ValueError(f"cannot repack a [{n}, {k}] {dtype} weight into [{into.n}, {into.k}] {into.panels.dtype}")
        else:
            panels = into.panels
        # A k group (a bf16 pair, an fp32 value) is one 32-bit word: moving words transposes at ~11 GB/s, moving the
        # group's elements ~1.4 GB/s (torch's strided copy, SmolLM2's gate_up in bf16, one thread).
        words = panels.view(torch.int32).view(panels.shape[:3])
        words.permute(0, 2, 1).copy_(source.contiguous().view(torch.int32).view(words.shape[0], PANEL, words.shape[1]))
    return PackedWeight(panels, n, k) if into is None else into


def linear(x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None = None, *,
           out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``[..., K]`` times the packed ``[N, K]`` weight, of its dtype (+ ``bias``, fp32 ``[N]``) -> ``[..., N]`` in
    ``out_dtype`` (bf16 weights: bf16, rounded once, or fp32; fp32 weights: fp32), on ``torch.get_num_threads()``
    threads."""
    n, k, form = packed.n, packed.k, _FORMATS[packed.panels.dtype]
    if x.dtype != packed.panels.dtype or x.shape[-1] != k:
        raise ValueError(f"{form.function} takes {form.name} inputs [..., {k}], got {x.dtype} {tuple(x.shape)}")
    if out_dtype not in (x.dtype, torch.float32):
        raise ValueError(f"{form.function} writes {form.name} or float32, not {out_dtype}")
    rows = x.reshape(-1, k)
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    y = torch.empty(rows.shape[0], n, dtype=out_dtype)
    function, threads = getattr(cpu_kernels.library(), form.function), torch.get_num_threads()
    bias_pointer = None if bias is None else bias.data_ptr()
    for start in range(0, max(rows.shape[0], 1), CHUNK_ROWS):
        count = min(CHUNK_ROWS, rows.shape[0] - start)
        status = function(rows.data_ptr() + start * rows.stride(0) * rows.element_size(), count, k, rows.stride(0),
                          packed.panels.data_ptr(), n, bias_pointer, y.data_ptr() + start * n * y.element_size(), n,
                          int(out_dtype == torch.float32), threads)
        if status != 0:
            raise RuntimeError(f"{form.function} refused [{count}, {k}] x [{n}, {k}] (no kernel in the build?)")
    return y.view(*x.shape[:-1], n)

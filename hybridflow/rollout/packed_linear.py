"""``y = x W^T + b`` with the weight packed once, ahead of the decode steps.

On CPU a decode step's matmuls have few rows (the live sequences) and large weights,
and ``F.linear`` (MKL sgemm) lays each weight out for its kernel again on every call.
oneDNN can pack a weight once (``mkldnn._reorder_linear_weight``) and multiply by the
packed copy afterwards. Measured on SmolLM2-135M's matrices, fp32, 2 threads, every
weight once per step: 1.6x faster at 64 rows and 2.7x at 8 rows than ``F.linear``
(see docs/benchmarks.md). The cost: one packed copy of every weight (memory), and
~0.2 s per 135M parameters to repack after a weight update.

Shapes: ``x`` ``[N, in]``, ``weight`` ``[out, in]``, ``bias`` ``[out]`` -> ``[N, out]``.

bf16 weights on a CPU with AVX-512-BF16 (issue 56) take a third path, the C kernel of
:mod:`hybridflow.rollout.bf16_linear` ("bf16 dpbf16 kernel"), which at decode row counts reads the weights
several times faster than oneDNN's bf16 matmul (docs/benchmarks.md); it holds its own packed copy instead.
fp32 weights on a CPU with AVX-512F take its fp32 twin (:mod:`hybridflow.rollout.fp32_linear`, "fp32 avx512
kernel"), which measured ahead of oneDNN's packed fp32 matmul. Both serve prefill too (level with oneDNN there),
so a weight on a kernel's path is packed once, for the kernel only.

Which path runs is decided once per dtype by a probe that packs a tiny weight and
multiplies by it: oneDNN's bf16 packing needs AVX-512 (bw/vl/dq) or AVX-NE-CONVERT and
raises on an AVX2-only CPU, so "the build has oneDNN" is not enough. Anywhere packing
does not apply (GPU, a build without oneDNN, fp16, fp64, a CPU without the ISA, or
``HYBRIDFLOW_PORTABLE_KERNELS=1``) the portable ``F.linear`` path is used; results agree
up to summation order (the tests run both paths on every machine).
"""

from __future__ import annotations

import functools
import logging
import os

import torch
import torch.nn.functional as F

from hybridflow.rollout import bf16_linear, fp32_linear

logger = logging.getLogger(__name__)

# The row count oneDNN picks the packed layout for; one packing serves every row count.
# 64 measured faster than 1 at every row count from 1 to 100 on SmolLM2-135M's shapes.
_PACKING_BATCH_HINT = 64
_PACKABLE_DTYPES = (torch.float32, torch.bfloat16)
PORTABLE_KERNELS_ENV = "HYBRIDFLOW_PORTABLE_KERNELS"
"""Set to 1 to force the portable ``F.linear`` path everywhere (tests use it to cover the fallback)."""
DPBF16_PATH = "bf16 dpbf16 kernel"
"""The path name of bf16 weights multiplied by :mod:`hybridflow.rollout.bf16_linear` (issue 56)."""
FP32_KERNEL_PATH = "fp32 avx512 kernel"
"""The path name of fp32 weights multiplied by :mod:`hybridflow.rollout.fp32_linear` (issue 56)."""
_KERNELS = {DPBF16_PATH: bf16_linear, FP32_KERNEL_PATH: fp32_linear}
"""Path -> the kernel's module (``pack``): it multiplies every row count, prefill too (in chunks of
``bf16_linear.CHUNK_ROWS`` rows, level with or ahead of oneDNN's packed matmul at 33-2048 rows, docs/benchmarks.md),
so no oneDNN copy is kept beside its own (issue 62: one packing per weight sync, not two)."""


def portable_kernels_forced() -> bool:
    """Whether ``HYBRIDFLOW_PORTABLE_KERNELS`` asks for the portable path (read on every call)."""
    return os.environ.get(PORTABLE_KERNELS_ENV, "").strip().lower() in ("1", "true", "yes")


@functools.lru_cache(maxsize=None)
def _onednn_packing_probe(dtype: torch.dtype) -> str | None:
    """``None`` where packing ``dtype`` weights works on this CPU, else the reason it does not."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return "this torch build has no oneDNN linear packing"
    try:
        weight = torch.ones(8, 8, dtype=dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, _PACKING_BATCH_HINT)
        out = torch.ops.mkldnn._linear_pointwise(torch.ones(2, 8, dtype=dtype), packed, None, "none", [], "")
    except RuntimeError as error:  # oneDNN names the missing ISA: keep its first line as the reason
        return str(error).strip().splitlines()[0]
    if not torch.equal(out.float(), torch.full((2, 8), 8.0)):
        return "oneDNN packed matmul gave a wrong result on the probe"
    return None


def kernel_path(dtype: torch.dtype, device: torch.device | str = "cpu") -> str:
    """One line naming the projection path for ``dtype`` weights on ``device``, and why."""
    if torch.device(device).type != "cpu":
        return f"F.linear ({torch.device(device).type})"
    if dtype not in _PACKABLE_DTYPES:
        return f"F.linear (oneDNN packing does not cover {dtype})"
    if portable_kernels_forced():
        return f"F.linear ({PORTABLE_KERNELS_ENV}=1)"
    if dtype == torch.bfloat16 and bf16_linear.unavailable_reason() is None:
        return DPBF16_PATH
    if dtype == torch.float32 and fp32_linear.unavailable_reason() is None:
        return FP32_KERNEL_PATH
    reason = _onednn_packing_probe(dtype)
    return "oneDNN-packed" if reason is None else f"F.linear (portable fallback: {reason})"


def onednn_packing_available(weight: torch.Tensor) -> bool:
    """Whether :class:`PackedLinear` packs ``weight`` on this CPU, for oneDNN or the bf16 kernel (probed once per
    dtype)."""
    return not kernel_path(weight.dtype, weight.device).startswith("F.linear")


class PackedLinear:
    """A frozen linear layer; rebuild it (``PackedLinear(new_weight)``) after the weight changes.

    Args:
        weight: ``[out, in]``; the packed copy is taken here, so later changes need a rebuild.
        bias: ``[out]`` or ``None``.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.out_features = weight.shape[0]
        self.path = kernel_path(weight.dtype, weight.device)
        self.packed = not self.path.startswith("F.linear")
        """Whether a packed copy is held (oneDNN's and / or a kernel's): a weight change needs a rebuild."""
        self.kernel_weight = None  # the bf16 / fp32 kernel's packed copy (their paths only)
        self.onednn = self.path == "oneDNN-packed"
        self.weight = None  # the kernel's path holds only its own copy (not even a reference to ``weight``)
        with torch.no_grad():
            if self.path in _KERNELS:
                self.kernel_weight = _KERNELS[self.path].pack(weight)
            elif self.onednn:
                self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _PACKING_BATCH_HINT)
            else:
                self.weight = weight.detach()
        self.bias = bias

    @property
    def bias(self) -> torch.Tensor | None:
        return self._bias

    @bias.setter
    def bias(self, bias: torch.Tensor | None) -> None:
        """A new bias (the weight kept): the kernel's fp32 copy follows."""
        self._bias = None if bias is None else bias.detach()
        self.kernel_bias = None if bias is None or self.kernel_weight is None else self._bias.float()

    def assign(self, weight: torch.Tensor | None, bias: torch.Tensor | None) -> bool:
        """Copy a new ``weight`` (``None``: keep it) and ``bias`` into this layer's own tensors, in place, and
        return True; False, changing nothing, where a rebuild is needed (a oneDNN-packed weight, another shape,
        dtype or device, a bias appearing or going). A kernel's packed weight is repacked in place. In place,
        kernels captured in a CUDA graph keep reading the right memory."""
        if self.kernel_weight is not None:
            return self._repack(weight, bias)
        if self.packed or not same_layout(weight, self.weight, allow_none=True):
            return False
        if not self._takes_bias(bias):
            return False
        with torch.no_grad():
            for new, own in ((weight, self.weight), (bias, self.bias)):
                if new is not None and new.data_ptr() != own.data_ptr():
                    own.copy_(new)
        return True

    def _takes_bias(self, bias: torch.Tensor | None) -> bool:
        return (bias is None) == (self.bias is None) and (bias is None or same_layout(bias, self.bias))

    def _repack(self, weight: torch.Tensor | None, bias: torch.Tensor | None) -> bool:
        """A kernel's path: the new weight packed over the old panels (a weight sync faults in no fresh memory:
        issue 62), the bias copied in place and the kernel's fp32 copy of it refreshed."""
        packed = self.kernel_weight
        if not self._takes_bias(bias):
            return False
        if weight is not None and (tuple(weight.shape), weight.dtype, weight.device.type) != (
                (packed.n, packed.k), packed.panels.dtype, "cpu"):
            return False
        with torch.no_grad():
            if weight is not None:
                _KERNELS[self.path].pack(weight, into=packed)
            if bias is not None and bias.data_ptr() != self.bias.data_ptr():
                self.bias.copy_(bias)
            self.bias = self.bias  # the kernel's fp32 copy follows
        return True

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, in]`` -> ``[N, out]``."""
        if self.kernel_weight is not None:  # either kernel, at every row count
            return bf16_linear.linear(x, self.kernel_weight, self.kernel_bias, out_dtype=x.dtype)
        if self.onednn:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


def same_layout(new: torch.Tensor | None, own: torch.Tensor, *, allow_none: bool = False) -> bool:
    """Whether ``new`` can be copied into ``own`` in place: same shape, dtype and device (``None``: ``allow_none``)."""
    if new is None:
        return allow_none
    return new.shape == own.shape and new.dtype == own.dtype and new.device == own.device

"""The policy head's log-probs and entropy on CPU through the C kernel of ``csrc/logprob_entropy.c`` (issue 62).

:func:`logprob_and_entropy` takes what :func:`hybridflow.algos.logprob_and_entropy` takes and returns the same
values to fp32 rounding: the kernel reads each row of logits twice forward and once backward, where the torch path
makes ~10 passes over each chunk (docs/benchmarks.md). It runs for CPU logits of the dtypes in
:data:`KERNEL_DTYPES`; elsewhere, and where the kernel is not built (no compiler, ``HYBRIDFLOW_CPU_KERNELS=torch``,
or a wrong probe: :func:`unavailable_reason`), the torch path runs.

Bounds against an fp64 reference (tests/models/test_logprob_kernel.py): log p within 1e-6 (1 + |lse|), the
entropy within 2e-6 (1 + H), each fp32 gradient element within what fp32 rounding allows: p_j's relative error
~eps (8 + 2 |lse| + 2 |log p_j|) (the exp, and the rounding of z_j - lse; the torch path has the same terms) times
|g_lp| p_j + |g_h| p_j (|log p_j| + H), plus the entropy's bound times |g_h| p_j; bf16 gradients are
those fp32 values rounded once to nearest even, as the torch path rounds its own, so an element lands one bf16 step
from torch's where the two fp32 values straddle a rounding boundary (~0.03 % of them at [1017, 49152]). A masked
logit (-inf) adds nothing, where the torch path's entropy is NaN (0 * -inf).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from pathlib import Path

import torch

from hybridflow.algos import logprob_and_entropy as torch_logprob_and_entropy
from hybridflow.cpu import kernel_march_flag, load_c_library
from hybridflow.models.default_model import cache_root

logger = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
FORCE_FALLBACK = "HYBRIDFLOW_CPU_KERNELS"
"""``torch`` forces the torch path (the same switch as the rollout's CPU kernels, read at the first call)."""
FLAGS = ("-O3", "-fno-trapping-math", "-fopenmp", "-Wno-psabi", "-shared", "-fPIC")
"""Beside ``-march`` (``native``, or ``$HYBRIDFLOW_KERNEL_MARCH``: :func:`hybridflow.cpu.kernel_march_flag`):
``-fno-trapping-math`` (nothing here traps) lets gcc keep the selects and conversions in vector lanes; ``-fopenmp``
links the OpenMP runtime torch already loaded. No ``-fassociative-math``: the sums' order is written out in the
source (16 lanes, fp64 block totals), and the exp rounds with ``(y + 1.5 * 2^23) - 1.5 * 2^23``, which that flag
would fold to ``y``."""
KERNEL_DTYPES = (torch.bfloat16,)
"""Dtypes routed through the kernel. fp32 works as well (the tests run it) but its values move in the last bits,
which would move the fp32 trainer behaviour pins (tests/trainer/test_behaviour_pin.py), recorded on the torch path;
bf16 training is the one the kernel is for."""

_POINTER, _SIZE = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES = {
    "logprob_entropy_forward": [_POINTER, _SIZE, _SIZE, _SIZE, ctypes.c_int] + [_POINTER] * 4 + [ctypes.c_int],
    "logprob_entropy_backward": [_POINTER, _SIZE, _SIZE, _SIZE, ctypes.c_int] + [_POINTER] * 6
    + [_SIZE, ctypes.c_int],
}


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernel, or ``None`` (forced off, no compiler, or the build failed: said once)."""
    if os.environ.get(FORCE_FALLBACK, "").lower() == "torch":
        return None
    return load_c_library(CSRC, "hybridflow_logprob", (kernel_march_flag(), *FLAGS), cache_root() / "kernels",
                          _SIGNATURES, logger=logger,
                          no_compiler="no C compiler (gcc or $CC): the log-prob head runs torch ops (slower)",
                          failed="the log-prob head kernel did not build (%s): torch ops instead (slower)")


@functools.cache
def unavailable_reason() -> str | None:
    """``None`` where the kernel runs here, else why not (not built, or wrong on a hand-checkable probe)."""
    if library() is None:
        return "the log-prob head kernel is not built"
    logits = torch.tensor([[0.0, 3.0 ** 0.5, -1e4], [1.0, 1.0, 1.0]])  # probs (1, e^1.73, 0) / s; uniform
    log_probs, entropy = _forward(logits, torch.tensor([1, 2]), True)[:2]
    s = 1.0 + torch.tensor(3.0 ** 0.5).exp().item()
    expected_lp = torch.tensor([3.0 ** 0.5 - torch.tensor(s).log().item(), -torch.tensor(3.0).log().item()])
    if not torch.allclose(log_probs, expected_lp, atol=1e-6) or abs(entropy[1].item() - expected_lp[1].abs()) > 1e-6:
        return "the log-prob head kernel gave a wrong result on the probe"
    return None


def logprob_and_entropy(*, logits: torch.Tensor, labels: torch.Tensor,
                        calculate_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`hybridflow.algos.logprob_and_entropy` through the kernel where it runs (CPU, a dtype of
    :data:`KERNEL_DTYPES`), else that function itself."""
    if logits.device.type != "cpu" or logits.dtype not in KERNEL_DTYPES or unavailable_reason() is not None:
        return torch_logprob_and_entropy(logits=logits, labels=labels, calculate_entropy=calculate_entropy)
    return kernel_logprob_and_entropy(logits=logits, labels=labels, calculate_entropy=calculate_entropy)


def kernel_logprob_and_entropy(*, logits: torch.Tensor, labels: torch.Tensor,
                               calculate_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The kernel alone (bf16 or fp32 CPU logits; the kernel must be built): fp32 ``[...]`` log-probs, entropy."""
    flat = logits.reshape(-1, logits.shape[-1])
    if flat.stride(-1) != 1 or (flat.shape[0] > 1 and flat.stride(0) < flat.shape[1]):
        flat = flat.contiguous()
    log_probs, entropy = _KernelLogprobEntropy.apply(flat, labels.reshape(-1).long().contiguous(), calculate_entropy)
    return log_probs.reshape(labels.shape), entropy.reshape(labels.shape) if calculate_entropy else None


def _pointer(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def _row_stride(rows: torch.Tensor) -> int:
    """Elements between rows (a single row's stride may be anything: V then)."""
    return rows.stride(0) if rows.shape[0] > 1 else rows.shape[1]


def _forward(rows: torch.Tensor, labels: torch.Tensor, calculate_entropy: bool):
    if rows.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"the log-prob head kernel takes bf16 or float32 logits, not {rows.dtype}")
    log_probs = torch.empty(rows.shape[0], dtype=torch.float32)
    lse = torch.empty_like(log_probs)
    entropy = torch.empty_like(log_probs) if calculate_entropy else torch.zeros_like(log_probs)
    status = library().logprob_entropy_forward(
        rows.data_ptr(), rows.shape[0], rows.shape[1], _row_stride(rows), int(rows.dtype == torch.bfloat16),
        labels.data_ptr(), log_probs.data_ptr(), _pointer(entropy if calculate_entropy else None), lse.data_ptr(),
        torch.get_num_threads())
    if status != 0:
        raise ValueError(f"log-prob head: a label outside [0, {rows.shape[1]}) or logits of shape {tuple(rows.shape)}")
    return log_probs, entropy, lse


class _KernelLogprobEntropy(torch.autograd.Function):
    """``rows [K, V]`` (unit stride along V), ``labels [K]`` -> (log p, entropy; zeros when not asked) fp32 ``[K]``;
    the semantics of :class:`hybridflow.algos.logprob._LogprobEntropy` (an entropy without a gradient costs the
    backward nothing)."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, labels: torch.Tensor, calculate_entropy: bool):
        log_probs, entropy, lse = _forward(rows, labels, calculate_entropy)
        ctx.save_for_backward(rows, labels, lse, entropy)
        ctx.calculate_entropy = calculate_entropy
        ctx.set_materialize_grads(False)
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs: torch.Tensor | None, grad_entropy: torch.Tensor | None):
        rows, labels, lse, entropy = ctx.saved_tensors
        if not ctx.calculate_entropy:
            grad_entropy = None
        if grad_log_probs is None and grad_entropy is None:
            return None, None, None
        grad_log_probs, grad_entropy = (None if g is None else g.float().contiguous()
                                        for g in (grad_log_probs, grad_entropy))
        grad_rows = torch.empty(rows.shape, dtype=rows.dtype)
        status = library().logprob_entropy_backward(
            rows.data_ptr(), rows.shape[0], rows.shape[1], _row_stride(rows), int(rows.dtype == torch.bfloat16),
            labels.data_ptr(), lse.data_ptr(), entropy.data_ptr(), _pointer(grad_log_probs), _pointer(grad_entropy),
            grad_rows.data_ptr(), _row_stride(grad_rows), torch.get_num_threads())
        if status != 0:
            raise ValueError(f"log-prob head backward refused logits of shape {tuple(rows.shape)}")
        return grad_rows, None, None

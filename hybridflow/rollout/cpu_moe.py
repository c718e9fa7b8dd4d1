"""A mixture-of-experts layer's routed experts as one C call on CPU (``csrc/moe_experts.c``).

Why: at a decode step each expert sees a few rows, and :func:`hybridflow.rollout.moe.grouped_experts` is a sort, two
oneDNN matmuls and a gate per used expert and an ``index_add`` (~40 small torch ops a layer, docs/benchmarks.md); the
kernel groups the (token, expert) pairs itself and reads each used expert's weights once, the gate (SiLU over the
halves, or gpt-oss's clamped SwiGLU over interleaved columns) and the weighted sum fused in.

It runs for fp32 CPU tensors with the kernels built (:func:`hybridflow.rollout.cpu_kernels.library`) and a gate it
knows; :func:`routed_experts` returns ``None`` otherwise and the caller runs the torch path (same outputs to fp32
rounding; ``HYBRIDFLOW_CPU_KERNELS=torch`` forces that, as for every CPU kernel).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hybridflow.rollout.cpu_kernels import library

SILU_HALVES, CLAMPED_SWIGLU = 0, 1
"""The kernel's ``gate_kind``: ``silu(gate) * up`` over ``[gate | up]``, or gpt-oss's clamped SwiGLU."""
BLOCK = 16
"""Output columns of one packed weight block (``COLUMN_BLOCK`` of ``csrc/moe_experts.c``)."""


@dataclass(frozen=True)
class KernelExperts:
    """An expert layer's tensors in the kernel's layout: fp32 column blocks ``[E, ceil(2 I / 16), hidden, 16]`` /
    ``[E, ceil(hidden / 16), I, 16]`` (:func:`column_blocks`, one copy of the experts), the module's biases
    ``[E, 2 I]`` / ``[E, hidden]``."""

    gate_up: torch.Tensor
    down: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down_bias: torch.Tensor | None
    gate_kind: int
    alpha: float = 0.0
    limit: float = 0.0


def kernel_experts(gate_up: torch.Tensor, down: torch.Tensor, gate_up_bias: torch.Tensor | None,
                   down_bias: torch.Tensor | None, clamp: tuple[float, float] | None) -> KernelExperts | None:
    """The layer (``gate_up`` ``[E, 2 I, hidden]``, ``down`` ``[E, hidden, I]``, views are fine) in the kernel's
    layout, or ``None`` where the kernel does not run (not fp32 on CPU, not built). ``clamp``: gpt-oss's ``(alpha, limit)`` (interleaved gate / up columns), ``None`` for SiLU over the halves."""
    tensors = [t for t in (gate_up, down, gate_up_bias, down_bias) if t is not None]
    if any(t.dtype != torch.float32 or t.device.type != "cpu" for t in tensors) or library() is None:
        return None
    alpha, limit = clamp if clamp is not None else (0.0, 0.0)

    def own(tensor):
        return None if tensor is None else tensor.detach().contiguous()

    return KernelExperts(gate_up=column_blocks(gate_up), down=column_blocks(down),
                         gate_up_bias=own(gate_up_bias), down_bias=own(down_bias), gate_kind=SILU_HALVES if clamp is None else CLAMPED_SWIGLU,
                         alpha=float(alpha), limit=float(limit))


def column_blocks(weight: torch.Tensor) -> torch.Tensor:
    """``[E, out, in]`` -> ``[E, ceil(out / 16), in, 16]``: each block of 16 output columns input-major and contiguous
    (the kernel's task reads one run), zeros past the last column."""
    experts, rows, inputs = weight.shape
    padded = torch.zeros(experts, -(-rows // BLOCK) * BLOCK, inputs, dtype=weight.dtype)
    padded[:, :rows] = weight.detach()
    return padded.view(experts, -1, BLOCK, inputs).transpose(2, 3).contiguous()


def routed_experts(hidden: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: KernelExperts | None,
                   activation) -> torch.Tensor | None:
    """``sum_k weights[n, k] * expert_{ids[n, k]}(hidden[n])`` ``[N, hidden]`` by the kernel, or ``None`` where it
    does not apply (no kernel layout, a SiLU-halves layer whose activation is not SiLU, not fp32 activations)."""
    if experts is None or hidden.dtype != torch.float32 or hidden.device.type != "cpu":
        return None
    if experts.gate_kind == SILU_HALVES and activation is not F.silu:
        return None
    hidden = hidden.contiguous()
    ids = ids.to(torch.int64).contiguous()
    weights = weights.to(torch.float32).contiguous()
    count, dim = hidden.shape
    out = torch.empty_like(hidden)
    status = library().moe_experts_f32(
        hidden.data_ptr(), ids.data_ptr(), weights.data_ptr(), count, ids.shape[1], experts.gate_up.data_ptr(),
        _pointer(experts.gate_up_bias), experts.down.data_ptr(), _pointer(experts.down_bias),
        experts.gate_up.shape[0], dim, experts.down.shape[2], experts.gate_kind, experts.alpha, experts.limit,
        out.data_ptr(), torch.get_num_threads())
    if status != 0:
        raise ValueError(f"moe_experts: an expert id outside [0, {experts.gate_up.shape[0]}) or out of memory")
    return out


def _pointer(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()

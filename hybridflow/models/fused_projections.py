"""Sibling projections of one input as one matmul under autocast: q / k / v, and an MLP's gate / up.

Under CPU or GPU autocast every ``nn.Linear`` casts its input to the compute dtype on its own, so a decoder layer
casts the attention norm's fp32 output three times (q, k, v) and the MLP norm's twice (gate, up), and the backward
adds five fp32 input gradients. Here the first projection of a group runs the whole group as one matmul over the
concatenated weights (cast once), hands the others their column block of the output (one ``split``: its backward is
one ``cat``), and the input gradient comes out of one matmul. The same dot products, so the same values within the
compute dtype's rounding; the weights stay separate parameters (checkpoints, weight sync, optimizer state unchanged).
Outside autocast, or called with another input (a sibling used on its own), each projection is its plain ``Linear``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
"""Child names of one module that read the same input (Llama / Qwen2 / Mistral attention and SwiGLU MLPs)."""


class FusedSiblings:
    """One group's shared matmul: the first projection's forward computes all, the others take their block."""

    def __init__(self, linears: list[torch.nn.Linear]):
        self.linears = linears
        self.pending: tuple[torch.Tensor, list[torch.Tensor]] | None = None

    def first(self, hidden: torch.Tensor) -> torch.Tensor:
        device = hidden.device.type
        if not torch.is_autocast_enabled(device):
            self.pending = None
            return F.linear(hidden, self.linears[0].weight, self.linears[0].bias)
        dtype = torch.get_autocast_dtype(device)
        weight = torch.cat([linear.weight.to(dtype) for linear in self.linears])
        biases = [linear.bias for linear in self.linears]
        bias = None if biases[0] is None else torch.cat([b.to(dtype) for b in biases])
        with torch.autocast(device, enabled=False):
            out = F.linear(hidden.to(dtype), weight, bias)
        first, *rest = torch.split(out, [linear.out_features for linear in self.linears], dim=-1)
        self.pending = (hidden, rest)
        return first

    def take(self, index: int, hidden: torch.Tensor) -> torch.Tensor:
        """Projection ``index`` (>= 1) of ``hidden``: the block :meth:`first` computed for this same input, else its
        own ``Linear``."""
        pending, linear = self.pending, self.linears[index]
        if pending is None or pending[0] is not hidden:
            return F.linear(hidden, linear.weight, linear.bias)
        if index == len(self.linears) - 1:
            self.pending = None
        return pending[1][index - 1]


def fuse_sibling_projections(model: torch.nn.Module) -> int:
    """Run each group of :data:`GROUPS` in ``model`` as one matmul under autocast (see the module docstring); the
    number of groups fused. A group is fused only where every member is a plain ``nn.Linear`` (LoRA or quantized
    layers are left alone) with the same input width and all with or all without a bias. Idempotent."""
    fused = 0
    for module in model.modules():
        for names in GROUPS:
            linears = [getattr(module, name, None) for name in names]
            if not _fusable(linears):
                continue
            group = FusedSiblings(linears)
            linears[0].forward = group.first
            for index, linear in enumerate(linears[1:], start=1):
                linear.forward = _Take(group, index)
            fused += 1
    return fused


class _Take:
    """A sibling's forward: ``group.take(index, hidden)`` (a picklable, deep-copyable callable, not a closure)."""

    def __init__(self, group: FusedSiblings, index: int):
        self.group, self.index = group, index

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.group.take(self.index, hidden)


def _fusable(linears: list) -> bool:
    if not all(type(linear) is torch.nn.Linear and "forward" not in vars(linear) for linear in linears):
        return False
    return (len({linear.in_features for linear in linears}) == 1
            and len({linear.bias is None for linear in linears}) == 1)

"""``y = x W^T + b`` with the weight packed once, ahead of the decode steps.

On CPU a decode step's matmuls have few rows (the live sequences) and large weights,
and ``F.linear`` (MKL sgemm) lays each weight out for its kernel again on every call.
oneDNN can pack a weight once (``mkldnn._reorder_linear_weight``) and multiply by the
packed copy afterwards. Measured on SmolLM2-135M's matrices, fp32, 2 threads, every
weight once per step: 1.6x faster at 64 rows and 2.7x at 8 rows than ``F.linear``
(see docs/benchmarks.md). The cost: one packed copy of every weight (memory), and
~0.2 s per 135M parameters to repack after a weight update.

Shapes: ``x`` ``[N, in]``, ``weight`` ``[out, in]``, ``bias`` ``[out]`` -> ``[N, out]``.
Anywhere oneDNN packing does not apply (GPU, a build without oneDNN, fp16, fp64) the plain
``F.linear`` path is used, so results are the same up to fp32 summation order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# The row count oneDNN picks the packed layout for; one packing serves every row count.
# 64 measured faster than 1 at every row count from 1 to 100 on SmolLM2-135M's shapes.
_PACKING_BATCH_HINT = 64
_PACKABLE_DTYPES = (torch.float32, torch.bfloat16)


def onednn_packing_available(weight: torch.Tensor) -> bool:
    """Whether ``weight`` can be packed for oneDNN (a CPU tensor of a supported dtype)."""
    return (weight.device.type == "cpu" and weight.dtype in _PACKABLE_DTYPES
            and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


class PackedLinear:
    """A frozen linear layer; rebuild it (``PackedLinear(new_weight)``) after the weight changes.

    Args:
        weight: ``[out, in]``; the packed copy is taken here, so later changes need a rebuild.
        bias: ``[out]`` or ``None``.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.out_features = weight.shape[0]
        self.packed = onednn_packing_available(weight)
        with torch.no_grad():
            if self.packed:
                self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _PACKING_BATCH_HINT)
            else:
                self.weight = weight.detach()
            self.bias = None if bias is None else bias.detach()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, in]`` -> ``[N, out]``."""
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)

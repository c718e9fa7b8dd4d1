"""The data-parallel context a worker sees: world size and global sums.

Workers never touch the device mesh directly; they ask this object for the global
token / sequence counts that the losses in hybridflow.algos take as arguments. The
local (single-process) context is the identity; the distributed one all-reduces.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DataParallel:
    """World size and rank of the data-parallel group; ``group`` is a torch process group or None."""

    world_size: int = 1
    rank: int = 0
    group: object | None = None

    def all_reduce_sum(self, value: torch.Tensor) -> torch.Tensor:
        """Sum of ``value`` over the group (identity when world_size == 1)."""
        if self.world_size == 1:
            return value
        import torch.distributed as dist

        reduced = value.to(self.collective_device(), copy=True)
        dist.all_reduce(reduced, op=dist.ReduceOp.SUM, group=self.group)
        return reduced.to(value.device)

    def all_reduce_max(self, value: int) -> int:
        """Largest ``value`` over the group."""
        if self.world_size == 1:
            return value
        import torch.distributed as dist

        tensor = torch.tensor([value], device=self.collective_device())
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group)
        return int(tensor.item())

    def collective_device(self) -> torch.device:
        """Where the group's collectives take their tensors: NCCL reduces CUDA tensors only."""
        import torch.distributed as dist

        if dist.get_backend(self.group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def global_counts(self, response_mask: torch.Tensor) -> dict[str, float]:
        """Valid response tokens and sequences of a mini-batch across all ranks."""
        local = torch.tensor([response_mask.sum().item(), response_mask.shape[0]], dtype=torch.float32)
        tokens, seqs = self.all_reduce_sum(local).tolist()
        return {"tokens": tokens, "seqs": seqs}


LOCAL = DataParallel()

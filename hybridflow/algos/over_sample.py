"""Over-sampling with early abort (verl's ``actor_rollout_ref.rollout.over_sample_rate``).

verl aborts a batch's remaining requests once ``(1 - r) * N`` of its ``N`` samples have finished, and trains
on the finished ones. The engines here decode a batch in lockstep, one token per sample per step, so the
samples that finish first are the shortest responses; ties go to the earlier sample (a stable order)::

    K    = ceil((1 - r) * N)                       (at least 1)
    keep = the K smallest response lengths          lengths [B] -> keep [B] (bool)
"""

from __future__ import annotations

import math

import torch

from hybridflow.algos.errors import AlgorithmError


def first_finished(*, response_lengths: torch.Tensor, over_sample_rate: float) -> torch.Tensor:
    """``[B]`` bool: True for the ``ceil((1 - over_sample_rate) * B)`` samples that finish first."""
    if not 0.0 <= over_sample_rate < 1.0:
        raise AlgorithmError(f"over_sample_rate={over_sample_rate} must be in [0, 1): the share of samples "
                             "aborted once the rest have finished")
    count = response_lengths.shape[0]
    kept = max(1, math.ceil((1.0 - over_sample_rate) * count - 1e-9))
    order = torch.sort(response_lengths, stable=True).indices
    keep = torch.zeros(count, dtype=torch.bool, device=response_lengths.device)
    keep[order[:kept]] = True
    return keep

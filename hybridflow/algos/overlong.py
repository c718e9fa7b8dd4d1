"""DAPO's soft overlong punishment (Yu et al., arXiv 2503.14476, section 3.4).

A linear length penalty inside a buffer of ``L_cache`` tokens before the maximum length
``L_max``, added to the task reward (``reward_model.overlong_buffer``)::

    R(|y|) = 0                                     |y| <= L_max - L_cache
             ((L_max - L_cache) - |y|) / L_cache   L_max - L_cache < |y| <= L_max
             -1                                    |y| > L_max

scaled by ``penalty_factor`` (verl's ``overlong_buffer.penalty_factor``).
"""

from __future__ import annotations

import torch

from hybridflow.algos.errors import AlgorithmError


def overlong_penalty(
    *,
    response_lengths: torch.Tensor,
    max_response_length: int,
    overlong_buffer_len: int,
    penalty_factor: float = 1.0,
) -> torch.Tensor:
    """Penalty ``[B]`` (<= 0) for response lengths ``[B]`` (valid tokens per sample)."""
    if not 0 < overlong_buffer_len <= max_response_length:
        raise AlgorithmError(
            f"overlong_buffer.len must be in (0, max_response_length={max_response_length}], "
            f"got {overlong_buffer_len}; shrink the buffer or raise data.max_response_length"
        )
    expected_length = max_response_length - overlong_buffer_len
    excess = response_lengths.to(torch.float32) - expected_length
    # clamp at -1: past L_max the paper's penalty is flat (verl truncates before that).
    return penalty_factor * (-excess / overlong_buffer_len).clamp(min=-1.0, max=0.0)

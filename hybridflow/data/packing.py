"""Sequence packing: several samples in one row, no padding.

Samples are concatenated into ``input_ids [1, N]`` with ``position_ids`` restarting at
0 for each sample and ``cu_seqlens [S + 1]`` (int32, cumulative lengths: sample ``s``
is ``[cu_seqlens[s], cu_seqlens[s+1])``), the layout of flash-attention's varlen
kernels. With attention restricted to each sample (varlen kernels, or
:func:`block_causal_mask` for SDPA) a packed row gives every token the same logits, and
so the same per-token loss, as the padded batch; the SFT loss mask already keeps each
sample's first token out of the targets, so no target crosses a boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hybridflow.errors import DataError


def pack_sequences(samples: Sequence[dict[str, torch.Tensor]], *, max_tokens: int) -> list[dict[str, Any]]:
    """Greedily pack samples, in order, into rows of at most ``max_tokens`` tokens.

    Each sample has ``input_ids [L]`` and ``loss_mask [L]``. Returns one dict per pack:
    ``input_ids, position_ids, loss_mask`` (``[1, N]``), ``cu_seqlens [S + 1]``,
    ``max_seqlen`` and ``sample_indices`` (which samples, in order).
    """
    packs: list[list[int]] = []
    used = max_tokens  # forces a new pack for the first sample
    for index, sample in enumerate(samples):
        length = sample["input_ids"].numel()
        if length > max_tokens:
            raise DataError(
                f"sample {index} has {length} tokens, more than the packing budget max_tokens={max_tokens}; "
                "raise it or lower data.max_length"
            )
        if used + length > max_tokens:
            packs.append([])
            used = 0
        packs[-1].append(index)
        used += length
    return [_concatenate([samples[i] for i in indices], indices) for indices in packs]


def _concatenate(samples: list[dict[str, torch.Tensor]], indices: list[int]) -> dict[str, Any]:
    lengths = torch.tensor([sample["input_ids"].numel() for sample in samples])
    cu_seqlens = torch.zeros(len(samples) + 1, dtype=torch.int32)
    cu_seqlens[1:] = lengths.cumsum(0)
    return {
        "input_ids": torch.cat([sample["input_ids"] for sample in samples]).unsqueeze(0),
        "position_ids": torch.cat([torch.arange(int(n)) for n in lengths]).unsqueeze(0),
        "loss_mask": torch.cat([sample["loss_mask"] for sample in samples]).unsqueeze(0),
        "cu_seqlens": cu_seqlens,
        "max_seqlen": int(lengths.max()),
        "sample_indices": list(indices),
    }


def block_causal_mask(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """``[1, 1, N, N]`` bool: token i attends to j iff same sample and j <= i (for SDPA)."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    segment = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
    total = segment.numel()
    causal = torch.ones(total, total, dtype=torch.bool).tril()
    return (causal & (segment[:, None] == segment[None, :]))[None, None]

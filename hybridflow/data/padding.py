"""Padding variable-length token lists into ``[B, T]`` tensors.

Prompts are left-padded (generation appends on the right, so every prompt must end in
the same column); training sequences are right-padded. Position ids count real tokens
only: ``position_ids = clamp(cumsum(attention_mask) - 1, min=0)``, so a left-padded
prompt starts at position 0 exactly like its unpadded self (HF's convention for
batched generation).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pad_token_id_of(tokenizer) -> int:
    """The tokenizer's pad id, or its eos id when it has no pad token (as for many base models)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def pad_sequences(
    seqs: Sequence[Sequence[int]], *, pad_value: int, side: str, length: int | None = None
) -> torch.Tensor:
    """``[B, T]`` long tensor; ``T = length`` or the longest sequence; ``side`` is 'left' or 'right'."""
    width = max((len(s) for s in seqs), default=0) if length is None else length
    out = torch.full((len(seqs), width), pad_value, dtype=torch.long)
    for row, seq in enumerate(seqs):
        if len(seq) > width:
            raise ValueError(f"sequence of {len(seq)} tokens does not fit padding length {width}")
        if not seq:
            continue
        values = torch.as_tensor(list(seq), dtype=torch.long)
        if side == "left":
            out[row, width - len(seq) :] = values
        else:
            out[row, : len(seq)] = values
    return out


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` positions of real tokens from 0; padding gets 0 (clamped)."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)

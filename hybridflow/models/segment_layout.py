"""Where the units of one packed row start and end, and how each attends: the record the segment attention
(:mod:`hybridflow.models.segment_attention`) and its FlexAttention path (:mod:`hybridflow.models.flex_segments`)
both read, in a module of its own so neither imports the other for it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class SegmentLayout:
    """Where the units of a packed row start and end, and how each attends.

    ``bounds``: ``[(start, end)]`` per unit, covering ``[0, N)`` in order.
    ``masks``: per unit ``None`` (causal) or a bool ``[L_u, L_u]`` (True = may attend).
    ``branches``: per unit None, or for a shared-prompt unit ``[prompt, response_1, ..., response_n]``
    lengths: the same attention as its mask, which lets a GPU run it with fused causal kernels
    (:func:`shared_prompt_attention`); None for the whole row: masks only.
    """

    bounds: list[tuple[int, int]]
    masks: list[torch.Tensor | None]
    branches: list[list[int] | None] | None = None
    positions: torch.Tensor | None = None
    """``[N]`` the whole row's position ids (under sequence parallelism the model's ``position_ids`` hold only
    this rank's slice, while attention sees the whole row): what sliding windows measure distance in."""
    flex_masks: dict = field(default_factory=dict, repr=False, compare=False)
    """FlexAttention block masks of this layout by (window, length, device), built by the first layer that needs
    one (:func:`hybridflow.models.flex_segments.block_mask`) and shared by the others."""

    def to(self, device: torch.device | str) -> "SegmentLayout":
        return SegmentLayout(self.bounds, [m if m is None else m.to(device) for m in self.masks], self.branches,
                             None if self.positions is None else self.positions.to(device))

"""Every unit of a packed row in one FlexAttention call (a GPU's training forward; issue 47).

:mod:`hybridflow.models.segment_attention` attends unit by unit: one SDPA call per unit, and a shared-prompt
unit's call carries a ``[L, L]`` mask, which has no flash kernel (on one H200 that attention was two thirds of
the 1.5B update). FlexAttention (Dong et al. 2024, "Flex Attention: A Programming Model for Generating
Optimized Attention Kernels") takes the whole row's attention pattern as a function of (query, key) indices and
compiles it into one fused kernel that skips the ``128 x 128`` tiles the pattern masks out, so the row costs
about ``sum_u L_u^2`` (less the masked tiles) in one launch a layer, forward and backward.

The pattern, from three ``[N]`` tensors built once per forward (:class:`RowRoles`): key ``j`` is visible to
query ``i`` iff

    unit[j] == unit[i]  and  (branch[j] == 0 or branch[j] == branch[i])  and  j <= i
    [and position[i] - position[j] < W  under a sliding window W]

with ``branch`` 0 for a plain unit's tokens and a shared prompt's, ``k`` for the ``k``-th response of a
shared-prompt unit. That is each unit's causal mask, and for a shared-prompt unit the mask
:class:`~hybridflow.models.segment_attention.SegmentLayout` holds: a response sees the prompt and its own
earlier tokens, never another response, and the prompt never sees a response. Gemma 2's soft cap is a score
modification (``c tanh(s / c)``); gpt-oss's attention sinks (one logit per head in every softmax) rescale the output
by ``exp(lse) / (exp(lse) + exp(sink))`` from the call's log-sum-exp. Scores, masks and the softmax follow the
same math as the per-unit path, so log-probs and gradients equal the padded forward's (tests/models/test_flex_segments.py; the gradient test needs
a GPU: FlexAttention has no CPU backward).

A layout FlexAttention cannot express (a unit with a mask but no branch lengths) or attention dropout keeps the
per-unit path.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from hybridflow.models.segment_layout import SegmentLayout


@dataclass(frozen=True)
class RowRoles:
    """``[N]`` per token of a packed row: its unit, its branch (0: prompt or plain unit; ``k``: the ``k``-th
    response of a shared-prompt unit) and its position id (what a sliding window measures distance in)."""

    unit: torch.Tensor
    branch: torch.Tensor
    position: torch.Tensor

    @classmethod
    def of(cls, layout: SegmentLayout, positions: torch.Tensor | None, device: torch.device) -> "RowRoles":
        """From the layout; ``positions`` ``[N]`` the row's position ids, or None (then each unit's are derived
        from the layout: a shared prompt's responses continue from the prompt's end)."""
        units, branches, derived = [], [], []
        for index, (start, end) in enumerate(layout.bounds):
            lengths = layout.branches[index] if layout.branches is not None else None
            units.append(torch.full((end - start,), index, dtype=torch.int32))
            if lengths is None:
                branches.append(torch.zeros(end - start, dtype=torch.int32))
                derived.append(torch.arange(end - start))
                continue
            branches += [torch.full((n,), k, dtype=torch.int32) for k, n in enumerate(lengths)]
            derived += [torch.arange(lengths[0])] + [torch.arange(lengths[0], lengths[0] + n) for n in lengths[1:]]
        position = positions if positions is not None else torch.cat(derived)
        return cls(torch.cat(units).to(device), torch.cat(branches).to(device), position.to(device))

    def mask_mod(self, window: int | None):
        """FlexAttention's ``mask_mod(batch, head, query, key) -> bool``: the visibility rule above."""
        unit, branch, position = self.unit, self.branch, self.position

        def visible(_batch, _head, query, key):
            seen = (unit[key] == unit[query]) & ((branch[key] == 0) | (branch[key] == branch[query])) & (key <= query)
            if window is not None:
                seen = seen & (position[query] - position[key] < window)
            return seen

        return visible


def expressible(layout: SegmentLayout, dropout: float) -> bool:
    """Whether one FlexAttention call computes ``layout``'s attention: every masked unit has its branch lengths
    (its mask is then the rule of :class:`RowRoles`), and no dropout (FlexAttention has none)."""
    if dropout:
        return False
    return all(mask is None or (layout.branches is not None and layout.branches[index] is not None)
               for index, mask in enumerate(layout.masks))


def block_mask(layout: SegmentLayout, positions: torch.Tensor | None, *, length: int, window: int | None,
               device: torch.device):
    """The row's FlexAttention ``BlockMask`` (which tiles to compute, and the rule inside partial ones); built
    once per layout and window (every layer of a forward shares it) and kept on the layout."""
    from torch.nn.attention.flex_attention import create_block_mask

    key = (window, length, str(device))
    cached = layout.flex_masks.get(key)
    if cached is None:
        roles = RowRoles.of(layout, positions, device)
        cached = create_block_mask(roles.mask_mod(window), None, None, length, length, device=device)
        layout.flex_masks[key] = cached
    return cached


def flex_segment_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, layout: SegmentLayout,
                           positions: torch.Tensor | None, scale: float | None, softcap: float | None,
                           window: int | None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """``query [1, H, N, D]``, ``key / value [1, KV, N, D]`` (same dtype; GQA when ``KV < H``) -> ``[1, H, N, D]``:
    the attention of every unit of ``layout`` in one call; ``sinks`` ``[H]``: attention-sink logits."""
    from torch.nn.attention.flex_attention import AuxRequest

    mask = block_mask(layout, positions, length=query.shape[2], window=window, device=query.device)
    score_mod = None if softcap is None else _soft_cap(softcap)
    flex = _flex(query.device.type)
    if sinks is None:
        return flex(query, key, value, block_mask=mask, score_mod=score_mod, scale=scale,
                    enable_gqa=key.shape[1] != query.shape[1])
    out, aux = flex(query, key, value, block_mask=mask, score_mod=score_mod, scale=scale,
                    enable_gqa=key.shape[1] != query.shape[1], return_aux=AuxRequest(lse=True))
    # softmax over keys + sink = (softmax over keys) * sigmoid(lse - sink), lse in fp32
    kept = torch.sigmoid(aux.lse - sinks.float().reshape(1, -1, 1))
    return (out.float() * kept[..., None]).to(out.dtype)


def _soft_cap(cap: float):
    """Gemma 2's ``c tanh(s / c)`` on each (scaled) score, as a FlexAttention ``score_mod``."""

    def capped(score, _batch, _head, _query, _key):
        return torch.tanh(score / cap) * cap

    return capped


@functools.cache
def _flex(device_type: str):
    """FlexAttention compiled into its fused kernel on CUDA (eager it is a slow reference); eager elsewhere
    (the CPU runs it only in tests, forward only)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention) if device_type == "cuda" else flex_attention

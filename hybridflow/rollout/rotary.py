"""The native decoder's rotary tables, computed once from the HF model's own rotary module (so every RoPE scaling
variant is honoured) and grown when a longer row needs them; one table per layer type where the architecture has
them (Gemma 3), and 3-D M-RoPE rows for a vision-language prompt."""

from __future__ import annotations

from collections.abc import Callable

import torch


class RotaryTables:
    """``cos, sin`` tables of one model, by layer kind.

    Args:
        rotary_emb: the HF model's rotary module.
        kinds: each layer's key (Gemma 3: its layer type; else None for all).
        like: returns a tensor of the device and dtype the tables are built in (the decoder's embeddings).
        half_tables: the module returns tables of half the head size (gpt-oss rotates ``x1 cos - x2 sin`` and
            ``x2 cos + x1 sin`` over the two halves): each is repeated twice, the rotate-half form, the same numbers.
    """

    def __init__(self, rotary_emb, kinds: list[str | None], *, like: Callable[[], torch.Tensor],
                 half_tables: bool = False):
        self.rotary_emb, self.kinds, self.like, self.half_tables = rotary_emb, kinds, like, half_tables
        self.tables: dict[str | None, tuple[torch.Tensor, torch.Tensor]] = {}

    def table(self, max_len: int, kind: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos, sin`` ``[max_len, head_dim]`` (cached); ``kind`` is the layer type the module takes (Gemma 3), None
        for the one table of the other architectures. Every table is grown to ``max_len`` at once (``kind`` None on
        Gemma 3: the first layer's)."""
        kind = kind if kind in self.kinds else self.kinds[0]
        current = self.tables.get(kind)
        if current is None or current[0].shape[0] < max_len:
            # A new dict, not an update: CUDA graphs hold the old one and see they are stale.
            self.tables = {each: self._rotary(max_len, each) for each in dict.fromkeys(self.kinds)}
        return self.tables[kind]

    def _rotary(self, max_len: int, kind: str | None) -> tuple[torch.Tensor, torch.Tensor]:
        like = self.like()
        positions = torch.arange(max_len, device=like.device)[None]
        probe = torch.zeros(1, dtype=like.dtype, device=like.device)
        extra = {} if kind is None else {"layer_type": kind}
        cos, sin = self.rotary_emb(probe, positions, **extra)
        if self.half_tables:
            cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
        return cos[0], sin[0]

    def mrope_rows(self, positions: torch.Tensor) -> dict[None, tuple[torch.Tensor, torch.Tensor]]:
        """``cos, sin`` rows ``[N, 1, D]`` at 3-D M-RoPE ``positions`` ``[3, N]`` (a vision-language prompt's), from
        the model's rotary module: its own sections (Qwen2-VL) or interleaving (Qwen3-VL)."""
        like = self.like()
        probe = torch.zeros(1, dtype=like.dtype, device=like.device)
        cos, sin = self.rotary_emb(probe, positions[:, None, :])
        return {None: (cos[0][:, None], sin[0][:, None])}

    def rows(self, positions: torch.Tensor, max_len: int) -> dict[str | None, tuple[torch.Tensor, torch.Tensor]]:
        """Each rotary table's ``cos, sin`` rows ``[N, 1, D]`` at ``positions`` ``[N]``, by layer kind."""
        rows = {}
        for kind in dict.fromkeys(self.kinds):
            cos_table, sin_table = self.table(max_len, kind)
            rows[kind] = (cos_table[positions][:, None], sin_table[positions][:, None])
        return rows

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


class PackedResponses:
    """A micro-batch of ``prompt ++ response`` rows packed into one row, for log-probs and values.

    Rows arrive as the PPO batch stores them (``input_ids`` / ``attention_mask`` ``[B, L]``:
    left-padded prompt ++ right-padded response, the last ``T`` columns the response). Only
    valid tokens are kept. With ``share_prompt`` the rows whose prompt tokens are identical
    (the ``n`` samples of a prompt) form one unit ``prompt, response_1, ..., response_n``;
    otherwise each row is its own unit ``prompt, response``.

    Attributes (``K`` = valid response tokens of the micro-batch, ``N`` = packed tokens):
        input_ids, position_ids: ``[1, N]``; positions restart at 0 per unit, and each
            response continues from its prompt's length.
        bounds, masks, branches: the units for :class:`hybridflow.models.segment_attention.SegmentLayout`
            (branches: per unit None, or ``[prompt, response_1, ...]`` lengths of a shared-prompt unit).
        source: ``[K]`` packed index whose output predicts / values each response token
            (the token before it: the prompt's last token for the first response token).
        rows, cols: ``[K]`` where each response token sits in the ``[B, T]`` output.
        labels: ``[K]`` the response tokens.
    """

    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, response_length: int,
                 share_prompt: bool):
        prompt_len = input_ids.shape[1] - response_length
        valid = attention_mask.bool()
        prompts = [input_ids[b, :prompt_len][valid[b, :prompt_len]] for b in range(len(input_ids))]
        responses = [input_ids[b, prompt_len:][valid[b, prompt_len:]] for b in range(len(input_ids))]
        self.shape = (len(input_ids), response_length)
        ids, pos, source, rows, cols, labels = [], [], [], [], [], []
        self.bounds: list[tuple[int, int]] = []
        self.masks: list[torch.Tensor | None] = []
        self.branches: list[list[int] | None] = []
        offset = 0
        for members in _units(prompts, share_prompt=share_prompt):
            prompt = prompts[members[0]]
            p = prompt.numel()
            ids.append(prompt)
            pos.append(torch.arange(p))
            cursor = offset + p
            for b in members:
                r = responses[b].numel()
                ids.append(responses[b])
                labels.append(responses[b])
                pos.append(torch.arange(p, p + r))
                source.append(torch.cat([torch.tensor([offset + p - 1]), torch.arange(cursor, cursor + r - 1)])[:r])
                rows.append(torch.full((r,), b))
                cols.append(torch.arange(r))
                cursor += r
            self.bounds.append((offset, cursor))
            lengths = [responses[b].numel() for b in members]
            self.masks.append(None if len(members) == 1 else _shared_prompt_mask(p, lengths))
            self.branches.append(None if len(members) == 1 else [p, *lengths])
            offset = cursor
        self.input_ids = torch.cat(ids)[None].to(input_ids.device)
        self.position_ids = torch.cat(pos)[None].to(input_ids.device)
        self.source = torch.cat(source).to(input_ids.device)
        self.rows, self.cols = torch.cat(rows).to(input_ids.device), torch.cat(cols).to(input_ids.device)
        self.labels = torch.cat(labels).to(input_ids.device)

    def scatter(self, values: torch.Tensor) -> torch.Tensor:
        """``[K, ...]`` per-response-token values -> ``[B, T, ...]``, zero where there is no token."""
        out = values.new_zeros((*self.shape, *values.shape[1:]))
        return out.index_put((self.rows, self.cols), values)

    def gather(self, values: torch.Tensor) -> torch.Tensor:
        """``[B, T, ...]`` per-response-token values -> ``[K, ...]`` in the packed row's order (scatter's inverse)."""
        return values[self.rows, self.cols]


def _units(prompts: list[torch.Tensor], *, share_prompt: bool) -> list[list[int]]:
    """Row indices per unit, in order of first appearance; rows with equal prompts share one."""
    if not share_prompt:
        return [[b] for b in range(len(prompts))]
    groups: dict[tuple[int, ...], list[int]] = {}
    for b, prompt in enumerate(prompts):
        groups.setdefault(tuple(prompt.tolist()), []).append(b)
    return list(groups.values())


def _shared_prompt_mask(prompt_len: int, response_lens: list[int]) -> torch.Tensor:
    """``[L, L]`` bool for ``prompt, r_1, ..., r_n``: causal, and a response token sees the prompt
    and its own response only."""
    branch = torch.repeat_interleave(torch.arange(len(response_lens) + 1),
                                     torch.tensor([prompt_len, *response_lens]))
    causal = torch.ones(branch.numel(), branch.numel(), dtype=torch.bool).tril()
    return causal & ((branch[None, :] == 0) | (branch[:, None] == branch[None, :]))

"""Placing sequence-level scores on tokens: the outcome reward sits on the last token.

Outcome-reward RL (PPO / GRPO as in verl) treats a response's score as the reward of
its final action, so ``token_level_scores[b, t] = score[b]`` at the last valid
response token of row ``b`` and 0 elsewhere; KL penalties and advantage estimators
then work on this ``[B, T]`` tensor. This is the only reward-placement code in
hybridflow.
"""

from __future__ import annotations

import torch


def place_scores_on_last_token(*, scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Scatter ``scores`` onto the last ``1`` of each row of ``response_mask``.

    Args:
        scores: ``[B]`` one score per response, on any device (scorers return CPU tensors).
        response_mask: ``[B, T]`` 1 (or True) on valid response tokens. Padding may be on
            either side; only the position of the last valid token matters.

    Returns:
        ``[B, T]`` float32 token-level scores; a row with no valid token is all zeros
        (its score has nowhere to go, and a reward on padding would leak into returns).
    """
    if scores.dim() != 1 or response_mask.dim() != 2 or scores.shape[0] != response_mask.shape[0]:
        shapes = f"{tuple(scores.shape)} and {tuple(response_mask.shape)}"
        raise ValueError(f"expected scores [B] and response_mask [B, T], got {shapes}")
    valid = response_mask.bool()
    positions = torch.arange(valid.shape[1], device=valid.device).expand_as(valid)
    last = torch.where(valid, positions, -1).amax(dim=1)  # [B], -1 for an all-masked row
    has_token = last >= 0
    token_level_scores = torch.zeros(valid.shape, dtype=torch.float32, device=valid.device)
    rows = torch.nonzero(has_token).squeeze(1)
    token_level_scores[rows, last[rows]] = scores.to(valid.device)[rows].float()
    return token_level_scores

"""Loss aggregation: a ``[B, T]`` per-token loss to one scalar (``loss_agg_mode``).

==========================  ===============================================================
mode                        loss
==========================  ===============================================================
token-mean                  sum_{i,t} m_it l_it / N_tok                 (DAPO, 2503.14476)
token-sum                   sum_{i,t} m_it l_it
seq-mean-token-sum          sum_i (sum_t m_it l_it) / N_seq
seq-mean-token-mean         sum_i (sum_t m_it l_it / sum_t m_it) / N_seq  (GRPO, 2402.03300)
seq-mean-token-sum-norm     sum_i (sum_t m_it l_it / L) / N_seq         (Dr.GRPO, 2503.20783)
==========================  ===============================================================

``N_tok`` and ``N_seq`` default to the counts in this call (valid tokens; rows with at
least one valid token). Pass the counts of the whole mini-batch, summed over
micro-batches and data-parallel ranks, as ``global_num_tokens`` / ``global_num_seqs``:
then each call returns its share of the global loss, and the sum over micro-batches
and ranks (gradient accumulation plus an all-reduce SUM) equals the full-batch loss,
however the batch was split. ``L`` is ``loss_scale_factor`` when given (verl's
``actor.loss_scale_factor`` / ``critic.loss_scale_factor``), else ``max_response_length``,
else the padded width; it must be a constant, not the padded width of one micro-batch.
"""

from __future__ import annotations

from typing import Callable

import torch

from hybridflow.algos.errors import UnknownAlgorithmError


def _at_least_one(count: torch.Tensor | float) -> torch.Tensor | float:
    # a batch with no valid token has loss 0, not 0 / 0
    return count.clamp(min=1) if isinstance(count, torch.Tensor) else max(count, 1)


def _seq_count(*, loss_mask: torch.Tensor, global_num_seqs: torch.Tensor | float | None) -> torch.Tensor | float:
    if global_num_seqs is not None:
        return _at_least_one(global_num_seqs)
    return _at_least_one((loss_mask.sum(dim=-1) > 0).sum())


def _token_mean(*, masked_loss, loss_mask, global_num_tokens, **_) -> torch.Tensor:
    count = global_num_tokens if global_num_tokens is not None else loss_mask.sum()
    return masked_loss.sum() / _at_least_one(count)


def _token_sum(*, masked_loss, loss_mask, **_) -> torch.Tensor:
    return masked_loss.sum()


def _seq_mean_token_sum(*, masked_loss, loss_mask, global_num_seqs, **_) -> torch.Tensor:
    seq_losses = masked_loss.sum(dim=-1)
    return seq_losses.sum() / _seq_count(loss_mask=loss_mask, global_num_seqs=global_num_seqs)


def _seq_mean_token_mean(*, masked_loss, loss_mask, global_num_seqs, **_) -> torch.Tensor:
    # clamp: an all-masked row has token sum 0 and contributes 0 instead of 0/0.
    seq_losses = masked_loss.sum(dim=-1) / loss_mask.sum(dim=-1).clamp(min=1)
    return seq_losses.sum() / _seq_count(loss_mask=loss_mask, global_num_seqs=global_num_seqs)


def _seq_mean_token_sum_norm(*, masked_loss, loss_mask, global_num_seqs, max_response_length, loss_scale_factor,
                             **_) -> torch.Tensor:
    norm = next(n for n in (loss_scale_factor, max_response_length, loss_mask.shape[-1]) if n is not None)
    seq_losses = masked_loss.sum(dim=-1) / norm
    return seq_losses.sum() / _seq_count(loss_mask=loss_mask, global_num_seqs=global_num_seqs)


_MODES: dict[str, Callable[..., torch.Tensor]] = {
    "token-mean": _token_mean,
    "token-sum": _token_sum,
    "seq-mean-token-sum": _seq_mean_token_sum,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}


def list_loss_agg_modes() -> list[str]:
    return list(_MODES)


def agg_loss(
    *,
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    global_num_tokens: torch.Tensor | float | None = None,
    global_num_seqs: torch.Tensor | float | None = None,
    max_response_length: int | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss ``[B, T]`` under ``loss_mask`` ``[B, T]`` to a scalar.

    See the module docstring for the equations and the global counts.
    """
    if loss_agg_mode not in _MODES:
        raise UnknownAlgorithmError(
            f"unknown loss_agg_mode {loss_agg_mode!r}; use one of: {', '.join(_MODES)}"
        )
    mask = loss_mask.to(loss_mat.dtype)
    # where, not a product: a masked-out inf/NaN (e.g. a padding logit) must not leak in.
    masked_loss = torch.where(mask > 0, loss_mat * mask, torch.zeros_like(loss_mat))
    return _MODES[loss_agg_mode](
        masked_loss=masked_loss,
        loss_mask=mask,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        max_response_length=max_response_length,
        loss_scale_factor=loss_scale_factor,
    )


def seq_norm_length(loss_scale_factor: int | None, max_response_length: int) -> int:
    """seq-mean-token-sum-norm's divisor: ``loss_scale_factor`` when set, else the response length verl pads to."""
    return loss_scale_factor if loss_scale_factor is not None else max_response_length

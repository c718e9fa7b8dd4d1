"""The SFT loss: token-mean negative log-likelihood of the target tokens.

For a micro-batch of sequences ``x`` with target mask ``m`` (``m[b, t] = 1``: token
``t`` is a target predicted from ``x[b, <t]``; prompt, padding and each sequence's
first token have ``m = 0``)

    L = -(1 / N) * sum_{b, t} m[b, t] * log p_theta(x[b, t] | x[b, <t])

where ``N`` is the number of target tokens of the whole optimizer step, summed over
every micro-batch and every data-parallel rank (not this micro-batch's count). Each
micro-batch then contributes exactly its share, so accumulating gradients over
micro-batches and summing them over ranks gives the full-batch gradient however the
batch was split (the token-mean of DAPO, arXiv:2503.14476, Sec. 3.3, applied to SFT).
"""

from __future__ import annotations

import torch

from hybridflow.algos import agg_loss, logprobs_from_logits


def sft_loss(*, logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor,
             global_num_tokens: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """This micro-batch's share of the step's token-mean cross-entropy.

    Args:
        logits: ``[B, T, V]`` model outputs; ``logits[:, t]`` predicts ``input_ids[:, t + 1]``.
        input_ids: ``[B, T]`` token ids (a packed row is ``B = 1``).
        loss_mask: ``[B, T]`` 1 on target tokens (``loss_mask[:, 0]`` is always 0).
        global_num_tokens: ``N``, target tokens of the whole optimizer step across ranks.

    Returns:
        ``(loss, metrics)``: the scalar to back-propagate and detached ``nll_sum`` /
        ``num_tokens`` of this micro-batch (summed, not averaged, so they add up).
    """
    token_logprobs = logprobs_from_logits(logits=logits[:, :-1], labels=input_ids[:, 1:])  # [B, T-1]
    return sft_loss_from_log_probs(token_logprobs=token_logprobs, loss_mask=loss_mask,
                                   global_num_tokens=global_num_tokens)


def sft_loss_from_log_probs(*, token_logprobs: torch.Tensor, loss_mask: torch.Tensor,
                            global_num_tokens: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """:func:`sft_loss` from ``token_logprobs [B, T-1]`` = log p(x[:, t + 1] | x[:, <= t]) (the form a
    sequence-parallel forward gathers)."""
    targets = loss_mask[:, 1:]
    loss = agg_loss(loss_mat=-token_logprobs, loss_mask=targets, loss_agg_mode="token-mean",
                    global_num_tokens=global_num_tokens)
    nll_sum = torch.where(targets > 0, -token_logprobs, torch.zeros_like(token_logprobs)).sum()
    metrics = {"nll_sum": nll_sum.detach(), "num_tokens": targets.sum().detach().float()}
    return loss, metrics

"""Log-probs and entropy of given responses under a causal LM (actor, reference, rollout check).

Only the response positions go through the LM head and the softmax (``logits_to_keep``),
which keeps the memory and the head's FLOPs at ``[B, T, V]`` instead of ``[B, L, V]``.
"""

from __future__ import annotations

import torch

from hybridflow.algos import entropy_from_logits, logprobs_from_logits
from hybridflow.algos.logprob import sum_pi_squared_from_logits


def compute_log_probs(model, *, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      position_ids: torch.Tensor | None, response_length: int, temperature: float = 1.0,
                      calculate_entropy: bool = False, calculate_sum_pi_squared: bool = False):
    """log p(response token t | prefix) ``[B, T]`` and optionally the entropy ``[B, T]``; with
    ``calculate_sum_pi_squared`` a third element, sum_v p(v | prefix)^2 ``[B, T]``.

    Args:
        input_ids / attention_mask / position_ids: ``[B, L]`` = left-padded prompt ++ response.
        response_length: ``T``, the last T columns are the response.
        temperature: logits are divided by it first (log-probs of the sampling distribution).
    """
    # Position L-T-1 predicts the first response token, L-2 the last one: only those T
    # positions go through the LM head (logits_to_keep), saving [B, L-T, V] of work.
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False,
                logits_to_keep=response_length + 1)
    logits = out.logits[:, -response_length - 1 : -1, :]
    if temperature != 1.0:
        logits = logits / temperature
    labels = input_ids[:, -response_length:]
    log_probs = logprobs_from_logits(logits=logits, labels=labels)
    entropy = entropy_from_logits(logits=logits) if calculate_entropy else None
    if calculate_sum_pi_squared:
        return log_probs, entropy, sum_pi_squared_from_logits(logits=logits.detach())
    return log_probs, entropy

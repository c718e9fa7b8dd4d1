"""Log-probs and entropy of given responses under a causal LM (actor, reference, rollout check).

Only the response positions go through the LM head and the softmax (``logits_to_keep``),
which keeps the memory and the head's FLOPs at ``[B, T, V]`` instead of ``[B, L, V]``.
"""

from __future__ import annotations

import torch

from hybridflow.algos import entropy_from_logits, logprobs_from_logits
from hybridflow.data.packing import PackedResponses
from hybridflow.models.segment_attention import SegmentLayout, packed_row_mask, use_segment_attention


def compute_log_probs(model, *, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      position_ids: torch.Tensor | None, response_length: int, temperature: float = 1.0,
                      calculate_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(response token t | prefix) ``[B, T]`` and optionally the entropy ``[B, T]``.

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
    return log_probs, entropy


def packed_log_probs(model, packed: PackedResponses, *, temperature: float = 1.0,
                     calculate_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`compute_log_probs` over a padding-free (optionally shared-prompt) packed row.

    Same values as the padded forward on every valid response token (zeros elsewhere):
    ``[B, T]`` log-probs and optionally entropy. Only the ``K`` positions that predict a
    response token go through the LM head (``logits_to_keep`` as an index tensor).
    """
    logits = model(**packed_forward_inputs(model, packed), logits_to_keep=packed.source).logits[0]
    if temperature != 1.0:
        logits = logits / temperature
    log_probs = logprobs_from_logits(logits=logits, labels=packed.labels)
    entropy = packed.scatter(entropy_from_logits(logits=logits)) if calculate_entropy else None
    return packed.scatter(log_probs), entropy


def packed_forward_inputs(model, packed: PackedResponses) -> dict:
    """Forward kwargs of a packed row for a model switched to segment attention."""
    use_segment_attention(model)
    device = packed.input_ids.device
    return dict(input_ids=packed.input_ids, position_ids=packed.position_ids,
                attention_mask=packed_row_mask().to(device), use_cache=False,
                segment_layout=SegmentLayout(packed.bounds, packed.masks).to(device))

"""Log-probs and entropy of given responses under a causal LM (actor, reference, rollout check).

Only the response positions go through the LM head and the softmax (``logits_to_keep``),
which keeps the memory and the head's FLOPs at ``[B, T, V]`` instead of ``[B, L, V]``.
"""

from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import checkpoint

from hybridflow.algos import entropy_from_logits, logprobs_from_logits
from hybridflow.algos.logprob import sum_pi_squared_from_logits
from hybridflow.data.packing import PackedResponses
from hybridflow.models.segment_attention import SegmentLayout, packed_row_mask, use_segment_attention
from hybridflow.models.ulysses import SequenceShard, sequence_parallel_of


@functools.cache
def _compiled(fn):
    """``fn`` through torch.compile (dynamic shapes: response lengths change every step), compiled once."""
    return torch.compile(fn, dynamic=True)


def compute_log_probs(model, *, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      position_ids: torch.Tensor | None, response_length: int, temperature: float = 1.0,
                      calculate_entropy: bool = False, calculate_sum_pi_squared: bool = False,
                      entropy_checkpointing: bool = False, use_torch_compile: bool = False) -> tuple:
    """log p(response token t | prefix) ``[B, T]`` and optionally the entropy ``[B, T]``; with
    ``calculate_sum_pi_squared`` a third element, sum_v p(v | prefix)^2 ``[B, T]``.

    Args:
        input_ids / attention_mask / position_ids: ``[B, L]`` = left-padded prompt ++ response.
        response_length: ``T``, the last T columns are the response.
        temperature: logits are divided by it first (log-probs of the sampling distribution).
        entropy_checkpointing: with gradients on, keep no ``[B, T, V]`` softmax for the entropy's
            backward; recompute it there (verl's ``actor.entropy_checkpointing``).
        use_torch_compile: run the log-prob and entropy math from the logits through torch.compile
            (verl's ``use_torch_compile``: the model forward itself stays eager).
    """
    # Position L-T-1 predicts the first response token, L-2 the last one: only those T
    # positions go through the LM head (logits_to_keep), saving [B, L-T, V] of work.
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False,
                logits_to_keep=response_length + 1)
    return _token_outputs(out.logits[:, -response_length - 1 : -1, :], input_ids[:, -response_length:],
                          temperature=temperature, calculate_entropy=calculate_entropy,
                          calculate_sum_pi_squared=calculate_sum_pi_squared,
                          entropy_checkpointing=entropy_checkpointing, use_torch_compile=use_torch_compile)


def _token_outputs(logits: torch.Tensor, labels: torch.Tensor, *, temperature: float, calculate_entropy: bool,
                   calculate_sum_pi_squared: bool, entropy_checkpointing: bool, use_torch_compile: bool) -> tuple:
    """(log-probs, entropy or None[, sum_v pi(v)^2]) per position of ``logits [..., V]`` (the
    switches: see :func:`compute_log_probs`)."""
    if temperature != 1.0:
        logits = logits / temperature
    logprob_fn = _compiled(logprobs_from_logits) if use_torch_compile else logprobs_from_logits
    entropy_fn = _compiled(entropy_from_logits) if use_torch_compile else entropy_from_logits
    log_probs = logprob_fn(logits=logits, labels=labels)
    entropy = None
    if calculate_entropy and entropy_checkpointing and torch.is_grad_enabled():
        entropy = checkpoint(entropy_fn, logits=logits, use_reentrant=False)
    elif calculate_entropy:
        entropy = entropy_fn(logits=logits)
    if calculate_sum_pi_squared:
        return log_probs, entropy, sum_pi_squared_from_logits(logits=logits.detach())
    return log_probs, entropy


def packed_log_probs(model, packed: PackedResponses, *, temperature: float = 1.0, calculate_entropy: bool = False,
                     calculate_sum_pi_squared: bool = False, entropy_checkpointing: bool = False,
                     use_torch_compile: bool = False) -> tuple:
    """:func:`compute_log_probs` over a padding-free (optionally shared-prompt) packed row.

    Same values as the padded forward on every valid response token (zeros elsewhere), each
    ``[B, T]``. Only the ``K`` positions that predict a response token go through the LM head
    (``logits_to_keep`` as an index tensor). With sequence parallelism (hybridflow.models.ulysses)
    each rank runs its slice of the row and the ``K`` values are gathered.
    """
    shard = packed_shard(model, packed)
    logits = model(**packed_forward_inputs(model, packed, shard=shard), logits_to_keep=shard.local_keep).logits[0]
    outs = _token_outputs(logits, packed.labels[shard.own], temperature=temperature,
                          calculate_entropy=calculate_entropy, calculate_sum_pi_squared=calculate_sum_pi_squared,
                          entropy_checkpointing=entropy_checkpointing, use_torch_compile=use_torch_compile)
    return tuple(None if out is None else packed.scatter(shard.gather(out)) for out in outs)


def packed_shard(model, packed: PackedResponses) -> SequenceShard:
    """This rank's slice of ``packed`` and its positions that predict / value a response token
    (the whole row without sequence parallelism)."""
    return SequenceShard(sequence_parallel_of(model), length=packed.input_ids.shape[1], keep=packed.source)


def packed_forward_inputs(model, packed: PackedResponses, *, shard: SequenceShard | None = None) -> dict:
    """Forward kwargs of a packed row (this rank's slice of it under sequence parallelism) for a
    model switched to segment attention."""
    return row_forward_inputs(model, input_ids=packed.input_ids, position_ids=packed.position_ids,
                              layout=SegmentLayout(packed.bounds, packed.masks),
                              shard=shard or packed_shard(model, packed))


def row_forward_inputs(model, *, input_ids: torch.Tensor, position_ids: torch.Tensor, layout: SegmentLayout,
                       shard: SequenceShard) -> dict:
    """Forward kwargs of one packed row ``[1, N]`` with segment ``layout``: the whole row, or
    ``shard``'s slice of it plus the sequence-parallel group the attention exchanges heads with."""
    use_segment_attention(model)
    device = input_ids.device
    bounds, masks = shard.layout(layout.bounds, layout.masks)
    inputs = dict(input_ids=shard.slice(input_ids), position_ids=shard.slice(position_ids),
                  attention_mask=packed_row_mask().to(device), use_cache=False,
                  segment_layout=SegmentLayout(bounds, masks).to(device))
    if shard.sp is not None:
        inputs["sequence_parallel"] = shard.sp
    return inputs

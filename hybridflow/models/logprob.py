"""Log-probs and entropy of given responses under a causal LM (actor, reference, rollout check).

Only the response positions go through the LM head and the softmax (``logits_to_keep``),
which keeps the memory and the head's FLOPs at ``[B, T, V]`` instead of ``[B, L, V]``.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from hybridflow.algos import entropy_from_logits, logprobs_from_logits
from hybridflow.algos.linear_logprob import linear_log_probs
from hybridflow.algos.logprob import sum_pi_squared_from_logits
from hybridflow.data.packing import PackedResponses
from hybridflow.models.logprob_kernel import logprob_and_entropy as logprob_head
from hybridflow.models.router_aux import router_forward_kwargs
from hybridflow.models.segment_attention import SegmentLayout, packed_row_mask, use_segment_attention
from hybridflow.models.ulysses import SequenceShard, sequence_parallel_of


@functools.cache
def _compiled(fn):
    """``fn`` through torch.compile (dynamic shapes: response lengths change every step), compiled once."""
    return torch.compile(fn, dynamic=True)


def compute_log_probs(model, *, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      position_ids: torch.Tensor | None, response_length: int, temperature: float = 1.0,
                      calculate_entropy: bool = False, calculate_sum_pi_squared: bool = False,
                      entropy_checkpointing: bool = False, use_torch_compile: bool = False,
                      chunked_head: bool = False, vision_inputs: dict | None = None,
                      gather_ids: torch.Tensor | None = None) -> tuple:
    """log p(response token t | prefix) ``[B, T]`` and optionally the entropy ``[B, T]``; with
    ``calculate_sum_pi_squared`` a third element, sum_v p(v | prefix)^2 ``[B, T]``; with ``gather_ids``
    ``[B, T, K]`` a last element, log p(gather_ids[b, t, k] | prefix) ``[B, T, K]`` (a distillation teacher's
    top-k tokens; computed from the full logits, so the chunked head is not used).

    Args:
        input_ids / attention_mask / position_ids: ``[B, L]`` = left-padded prompt ++ response.
        response_length: ``T``, the last T columns are the response.
        temperature: logits are divided by it first (log-probs of the sampling distribution).
        entropy_checkpointing: with gradients on, keep no ``[B, T, V]`` softmax for the entropy's
            backward; recompute it there (verl's ``actor.entropy_checkpointing``).
        use_torch_compile: run the log-prob and entropy math from the logits through torch.compile
            (verl's ``use_torch_compile``: the model forward itself stays eager).
        chunked_head: log-probs and entropy from the final hidden states and the head's weight in
            chunks of tokens, never the ``[B, T, V]`` logits (verl's ``use_fused_kernels``); same values.
        vision_inputs: a VLM's images of these rows (``hybridflow.models.vision.vision_forward_inputs``);
            the model then computes its own 3-D positions and ``position_ids`` is not used.
    """
    # Position L-T-1 predicts the first response token, L-2 the last one: only those T
    # positions go through the LM head (logits_to_keep), saving [B, L-T, V] of work.
    length = input_ids.shape[1]
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False,
                  **router_forward_kwargs(model))
    if vision_inputs:
        inputs.update(vision_inputs, position_ids=None)
    keep = torch.arange(length - response_length - 1, length - 1, device=input_ids.device)
    return _forward_token_outputs(model, inputs, keep=keep, labels=input_ids[:, -response_length:],
                                  temperature=temperature, calculate_entropy=calculate_entropy,
                                  calculate_sum_pi_squared=calculate_sum_pi_squared,
                                  entropy_checkpointing=entropy_checkpointing, use_torch_compile=use_torch_compile,
                                  chunked_head=chunked_head, gather_ids=gather_ids)


def _forward_token_outputs(model, inputs: dict, *, keep: torch.Tensor, labels: torch.Tensor, chunked_head: bool,
                           gather_ids: torch.Tensor | None = None, **switches) -> tuple:
    """(log-probs, entropy or None[, sum_v pi(v)^2]) ``labels``-shaped, of the positions ``keep`` of
    ``model(**inputs)``: from the logits, or with ``chunked_head`` from the hidden states in chunks
    (:func:`hybridflow.algos.linear_logprob.linear_log_probs`, no ``[K, V]`` logits)."""
    head = chunk_capable_head(model) if chunked_head and gather_ids is None else None
    if head is None:
        logits = model(**inputs, logits_to_keep=keep).logits
        outs = _token_outputs(logits, labels, **switches)
        if gather_ids is None:
            return outs
        scaled = logits / switches["temperature"] if switches["temperature"] != 1.0 else logits
        return (*outs, torch.log_softmax(scaled.float(), dim=-1).gather(-1, gather_ids.long()))
    with _head_returns_token_outputs(head, labels=labels, temperature=switches["temperature"],
                                     calculate_entropy=switches["calculate_entropy"],
                                     calculate_sum_pi_squared=switches["calculate_sum_pi_squared"]):
        stacked = model(**inputs, logits_to_keep=keep).logits
    log_probs, entropy, sum_sq = stacked.unbind(-1)
    outs = (log_probs, entropy if switches["calculate_entropy"] else None)
    return (*outs, sum_sq) if switches["calculate_sum_pi_squared"] else outs


def chunk_capable_head(model) -> torch.nn.Linear | None:
    """The model's LM head when the chunked log-prob can replace it (a bias-free ``nn.Linear``, no logit
    soft-capping); None otherwise, saying so once."""
    head = model.get_output_embeddings()
    if type(head) is torch.nn.Linear and head.bias is None and not getattr(model.config, "final_logit_softcapping",
                                                                          None):
        return head
    _warn_head_fallback(type(head).__name__)
    return None


@functools.cache
def _warn_head_fallback(head_type: str) -> None:
    warnings.warn(f"use_fused_kernels: the LM head ({head_type}) is not a bias-free nn.Linear without soft-capping; "
                  "log-probs come from the full logits for this model", stacklevel=3)


@contextlib.contextmanager
def _head_returns_token_outputs(head: torch.nn.Linear, *, labels: torch.Tensor, temperature: float,
                                calculate_entropy: bool, calculate_sum_pi_squared: bool) -> Iterator[None]:
    """Inside, ``head(hidden [B, K, H])`` returns ``[B, K, 3]`` = (log p, entropy, sum p^2) of ``labels
    [B, K]`` instead of logits. Swapping the head's forward (not calling the body and the head apart)
    keeps every wrapper's hooks in place: FSDP2 unshards the weight, autocast covers the matmuls."""
    def token_outputs(hidden: torch.Tensor) -> torch.Tensor:
        outs = linear_log_probs(hidden=hidden, weight=head.weight, labels=labels.reshape(hidden.shape[:-1]),
                                temperature=temperature, calculate_entropy=calculate_entropy,
                                calculate_sum_pi_squared=calculate_sum_pi_squared)
        return torch.stack([outs[0] if out is None else out for out in outs], dim=-1)

    head.forward = token_outputs
    try:
        yield
    finally:
        del head.forward


def _token_outputs(logits: torch.Tensor, labels: torch.Tensor, *, temperature: float, calculate_entropy: bool,
                   calculate_sum_pi_squared: bool, entropy_checkpointing: bool, use_torch_compile: bool) -> tuple:
    """(log-probs, entropy or None[, sum_v pi(v)^2]) per position of ``logits [..., V]`` (the
    switches: see :func:`compute_log_probs`)."""
    if temperature != 1.0:
        logits = logits / temperature
    if not use_torch_compile:  # one pass, a closed-form backward; keeps no softmax (entropy_checkpointing's aim)
        log_probs, entropy = logprob_head(logits=logits, labels=labels, calculate_entropy=calculate_entropy)
        if calculate_sum_pi_squared:
            return log_probs, entropy, sum_pi_squared_from_logits(logits=logits.detach())
        return log_probs, entropy
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
                     use_torch_compile: bool = False, chunked_head: bool = False,
                     gather_ids: torch.Tensor | None = None) -> tuple:
    """:func:`compute_log_probs` over a padding-free (optionally shared-prompt) packed row.

    Same values as the padded forward on every valid response token (zeros elsewhere), each
    ``[B, T]``. Only the ``K`` positions that predict a response token go through the LM head
    (``logits_to_keep`` as an index tensor). With sequence parallelism (hybridflow.models.ulysses)
    each rank runs its slice of the row and the ``K`` values are gathered.
    """
    shard = packed_shard(model, packed)
    outs = _forward_token_outputs(model, packed_forward_inputs(model, packed, shard=shard),
                                  keep=shard.local_keep, labels=packed.labels[shard.own][None],
                                  temperature=temperature, calculate_entropy=calculate_entropy,
                                  calculate_sum_pi_squared=calculate_sum_pi_squared,
                                  entropy_checkpointing=entropy_checkpointing, use_torch_compile=use_torch_compile,
                                  chunked_head=chunked_head,
                                  gather_ids=None if gather_ids is None else packed.gather(gather_ids)[shard.own][None])
    return tuple(None if out is None else packed.scatter(shard.gather(out[0])) for out in outs)


def packed_shard(model, packed: PackedResponses) -> SequenceShard:
    """This rank's slice of ``packed`` and its positions that predict / value a response token
    (the whole row without sequence parallelism)."""
    return SequenceShard(sequence_parallel_of(model), length=packed.input_ids.shape[1], keep=packed.source)


def packed_forward_inputs(model, packed: PackedResponses, *, shard: SequenceShard | None = None) -> dict:
    """Forward kwargs of a packed row (this rank's slice of it under sequence parallelism) for a
    model switched to segment attention."""
    return row_forward_inputs(model, input_ids=packed.input_ids, position_ids=packed.position_ids,
                              layout=SegmentLayout(packed.bounds, packed.masks, packed.branches),
                              shard=shard or packed_shard(model, packed))


def row_forward_inputs(model, *, input_ids: torch.Tensor, position_ids: torch.Tensor, layout: SegmentLayout,
                       shard: SequenceShard) -> dict:
    """Forward kwargs of one packed row ``[1, N]`` with segment ``layout``: the whole row, or
    ``shard``'s slice of it plus the sequence-parallel group the attention exchanges heads with."""
    use_segment_attention(model)
    device = input_ids.device
    bounds, masks = shard.layout(layout.bounds, layout.masks)
    branches = layout.branches if shard.sp is None else None  # a padded sequence-parallel row: masks only
    row_positions = F.pad(position_ids[0], (0, shard.padded - position_ids.shape[1]))  # the padding: one more unit
    inputs = dict(input_ids=shard.slice(input_ids), position_ids=shard.slice(position_ids),
                  attention_mask=packed_row_mask().to(device), use_cache=False, **router_forward_kwargs(model),
                  segment_layout=SegmentLayout(bounds, masks, branches, row_positions).to(device))
    if shard.sp is not None:
        inputs["sequence_parallel"] = shard.sp
    return inputs

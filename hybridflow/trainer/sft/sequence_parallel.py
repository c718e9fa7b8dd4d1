"""The SFT loss of one packed micro-batch under Ulysses sequence parallelism.

Each rank of the sequence-parallel group runs its slice of the packed row ``[1, N]``
(hybridflow.models.ulysses); the log-probs of the ``N - 1`` next-token predictions are
gathered, so every rank evaluates the same token-mean loss (``sft_loss_from_log_probs``)
as a single process would over the whole row.
"""

from __future__ import annotations

import torch

from hybridflow.algos import logprobs_from_logits
from hybridflow.models.logprob import row_forward_inputs
from hybridflow.models.ulysses import SequenceParallel, SequenceShard
from hybridflow.trainer.sft.loss import sft_loss_from_log_probs


def sequence_parallel_sft_loss(model, inputs: dict, *, sp: SequenceParallel, global_num_tokens: float):
    """``inputs``: a packed micro-batch (``input_ids, position_ids, loss_mask [1, N]``, ``segment_layout``)
    on the model's device. Returns :func:`sft_loss_from_log_probs`'s ``(loss, metrics)``."""
    input_ids = inputs["input_ids"]
    predicting = torch.arange(input_ids.shape[1] - 1, device=input_ids.device)  # position t predicts t + 1
    shard = SequenceShard(sp, length=input_ids.shape[1], keep=predicting)
    forward = row_forward_inputs(model, input_ids=input_ids, position_ids=inputs["position_ids"],
                                 layout=inputs["segment_layout"], shard=shard)
    logits = model(**forward, logits_to_keep=shard.local_keep).logits[0]  # [K_s, V]
    labels = input_ids[0, 1:][shard.own]
    token_logprobs = shard.gather(logprobs_from_logits(logits=logits, labels=labels))[None]  # [1, N - 1]
    return sft_loss_from_log_probs(token_logprobs=token_logprobs, loss_mask=inputs["loss_mask"],
                                   global_num_tokens=global_num_tokens)

"""Log-probs (and entropy) of a batch's responses under a model, micro-batch by micro-batch.

Shared by the actor (old log-probs), the reference policy and the rollout-correction
metric: one code path, so the three can only differ by the weights they use.
"""

from __future__ import annotations

import torch

from hybridflow.data.batch import Batch
from hybridflow.data.packing import PackedResponses
from hybridflow.models import compute_log_probs, packed_log_probs
from hybridflow.models.vision import vision_forward_inputs
from hybridflow.workers.micro_batches import micro_batches, pad_right, trimmed_inputs


def forward_layout(*, use_remove_padding: bool, use_shared_prompt: bool = False) -> str:
    """The layout the model config keys select (shared prompts imply packing).

    How a micro-batch goes through the model: ``padded`` ``[b, L]`` rows (all-pad columns trimmed);
    ``packed``: the valid tokens of all rows in one row (``use_remove_padding``); ``shared_prompt``:
    packed, and the rows of one prompt share its tokens (``use_shared_prompt``). Same values on every
    valid response token (see hybridflow.models.segment_attention).
    """
    if use_shared_prompt:
        return "shared_prompt"
    return "packed" if use_remove_padding else "padded"


def pack_micro_batch(micro: Batch, *, layout: str) -> PackedResponses:
    """The packed row of a micro-batch in the ``packed`` or ``shared_prompt`` layout."""
    return PackedResponses(micro["input_ids"], micro["attention_mask"], response_length=micro["responses"].shape[1],
                           share_prompt=layout == "shared_prompt")


def micro_batch_log_probs(model, micro: Batch, *, temperature: float, calculate_entropy: bool,
                          calculate_sum_pi_squared: bool = False, layout: str = "padded",
                          entropy_checkpointing: bool = False, use_torch_compile: bool = False,
                          chunked_head: bool = False, gather_ids: torch.Tensor | None = None):
    """(log_probs [b, T], entropy [b, T] or None) of one micro-batch in the given layout; with
    ``calculate_sum_pi_squared`` a third element, sum_v pi(v)^2 [b, T] (the other switches: see
    ``hybridflow.models.compute_log_probs``). A VLM's rows carry their images in ``multi_modal_inputs``
    (padded layout only: the trainer picks it for VLMs). ``gather_ids [b, T, K]`` adds a last element, the log-probs
    of those token ids ``[b, T, K]`` (on-policy distillation's top-k)."""
    switches = dict(calculate_sum_pi_squared=calculate_sum_pi_squared, entropy_checkpointing=entropy_checkpointing,
                    use_torch_compile=use_torch_compile, chunked_head=chunked_head)
    if layout != "padded":
        return packed_log_probs(model, pack_micro_batch(micro, layout=layout), temperature=temperature,
                                calculate_entropy=calculate_entropy, gather_ids=gather_ids, **switches)
    inputs, resp_len = trimmed_inputs(micro)
    if gather_ids is not None:
        switches["gather_ids"] = gather_ids[:, :resp_len]
    images = micro["multi_modal_inputs"] if "multi_modal_inputs" in micro else None
    switches["vision_inputs"] = vision_forward_inputs(model, images, inputs["input_ids"])
    outs = compute_log_probs(model, **inputs, response_length=resp_len, temperature=temperature,
                             calculate_entropy=calculate_entropy, **switches)
    return tuple(None if out is None else pad_right(out, micro["responses"].shape[1]) for out in outs)


@torch.no_grad()
def batch_log_probs(model, batch: Batch, *, temperature: float, micro_batch_size: int | None,
                    use_dynamic_bsz: bool = False, max_token_len: int | None = None,
                    calculate_entropy: bool = False, calculate_sum_pi_squared: bool = False, dp=None,
                    layout: str = "padded", use_torch_compile: bool = False, chunked_head: bool = False) -> tuple:
    """Log-probs ``[B, T]`` (and entropy ``[B, T]``) of ``batch["responses"]``; no gradients.
    With ``calculate_sum_pi_squared`` a third element, sum_v pi(v)^2 ``[B, T]``.

    Micro-batches (fixed or token-budget) are consecutive rows, so results are in batch order.
    """
    was_training = model.training
    model.eval()
    pieces = micro_batches(batch, micro_batch_size=micro_batch_size, use_dynamic_bsz=use_dynamic_bsz,
                           max_token_len=max_token_len, dp=dp)
    outs = [micro_batch_log_probs(model, m, temperature=temperature, calculate_entropy=calculate_entropy,
                                  calculate_sum_pi_squared=calculate_sum_pi_squared, layout=layout,
                                  use_torch_compile=use_torch_compile, chunked_head=chunked_head) for m in pieces]
    model.train(was_training)
    return tuple(None if parts[0] is None else torch.cat(parts) for parts in zip(*outs))

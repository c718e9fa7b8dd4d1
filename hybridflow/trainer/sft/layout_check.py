"""The layout guard for SFT's packed rows (``data.use_packing`` and its aliases): the model's packed forward (segment
attention, or flash-attention's varlen kernels from position ids) must give each target token the log-prob of its
padded forward on a probe of ragged samples, else the padded rows run, said in one line
(:mod:`hybridflow.models.layout_guard` is the same guard for the PPO roles)."""

from __future__ import annotations

import logging

import torch

from hybridflow.models.layout_guard import Verdict, disagreement_line, probe_rows, rounding_tolerance
from hybridflow.models.segment_attention import attention_kwargs_seen, use_segment_attention
from hybridflow.trainer.sft.batches import Sample, micro_batch_inputs

logger = logging.getLogger(__name__)
PROBE_GROUPS = ((4, (5,)), (2, (3,)), (6, (4,)))
"""Three samples of 9, 5 and 10 tokens (prompt, response lengths as the PPO guard's probe)."""


def sft_packing_agrees(model: torch.nn.Module, *, pad_token_id: int) -> bool:
    """Whether packed rows give the padded forward's target log-probs on the probe; a warning line when not."""
    implementation, was_training = model.config._attn_implementation, model.training
    samples = probe_samples(model)
    model.eval()
    try:
        with torch.no_grad(), attention_kwargs_seen() as features:
            reference = _target_log_probs(model, samples, packed=False, pad_token_id=pad_token_id)
            alone = torch.cat([_target_log_probs(model, [s], packed=False, pad_token_id=pad_token_id)
                               for s in samples])
            tolerance = rounding_tolerance(model, reference, alone)
            difference = float((_target_log_probs(model, samples, packed=True, pad_token_id=pad_token_id)
                                - reference).abs().max())
    finally:
        model.config._attn_implementation = implementation
        model.train(was_training)
    if difference <= tolerance:
        return True
    verdict = Verdict({"packed": difference}, tolerance, "padded",
                      {name: set(kwargs) for name, kwargs in features.items() if kwargs})
    logger.warning(disagreement_line(model, "packed", verdict, key="data.use_packing"))
    return False


def probe_samples(model: torch.nn.Module) -> list[Sample]:
    """The probe's rows as SFT samples: ``input_ids [L]``, ``loss_mask [L]`` (every token a target but the first)."""
    probe = probe_rows(model.config.get_text_config().vocab_size, next(model.parameters()).device,
                       groups=PROBE_GROUPS, seed=1)
    samples = []
    for ids, mask in zip(probe.input_ids, probe.attention_mask):
        ids = ids[mask.bool()]
        loss_mask = torch.ones_like(ids)
        loss_mask[0] = 0
        samples.append({"input_ids": ids, "loss_mask": loss_mask})
    return samples


def _target_log_probs(model, samples: list[Sample], *, packed: bool, pad_token_id: int) -> torch.Tensor:
    """``[K]`` log p(target) of every target token of ``samples``, in sample order, through the SFT trainer's own
    input layout."""
    inputs = micro_batch_inputs(samples, use_packing=packed, pad_token_id=pad_token_id,
                                attn_implementation=model.config._attn_implementation)
    extra = {}
    if "segment_layout" in inputs:
        use_segment_attention(model)
        extra["segment_layout"] = inputs.pop("segment_layout")
    device = next(model.parameters()).device
    inputs = {key: None if value is None else value.to(device) for key, value in inputs.items()}
    logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                   position_ids=inputs["position_ids"], use_cache=False, **extra).logits.float()
    log_probs = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, inputs["input_ids"][:, 1:, None])[..., 0]
    return log_probs[inputs["loss_mask"][:, 1:].bool()]

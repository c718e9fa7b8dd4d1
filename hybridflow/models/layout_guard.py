"""The guard no model slips past: a packed layout is used only where it computes the model's own padded forward.

The packed layouts (padding-free, shared prompt; segment attention per unit, FlexAttention, the chunked head)
reproduce what they know of attention: causal masks, sliding windows, Gemma 2's soft cap, gpt-oss's sinks. A model
that does anything else (an attention kwarg of its own, a layer that mixes the rows of a batch) would train on
another function than it samples from, silently. So before training, :func:`checked_layout` runs a small probe
(ragged rows, one prompt shared by two responses) through the padded forward (the model's own attention
implementation) and through the chosen layout, and compares the response tokens' log-probs (a value model's
backbone: its last hidden states). Beyond fp32 rounding (measured on the probe itself: each row alone against the
padded batch) the run falls back to the next layout that agrees, in one warning line naming what the packed
attention did not honour.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from hybridflow.data.packing import PackedResponses
from hybridflow.models.logprob import compute_log_probs, packed_forward_inputs, packed_log_probs
from hybridflow.models.segment_attention import attention_kwargs_seen

logger = logging.getLogger(__name__)

FALLBACKS = {"shared_prompt": ("shared_prompt", "packed", "padded"), "packed": ("packed", "padded")}
"""The layouts tried, in order, for a chosen one (the padded forward is the reference, so it always agrees)."""
PROBE_GROUPS = ((5, (3, 6)), (3, (4,)))
"""(prompt length, response lengths) of the probe: a prompt shared by two responses, and another of its own."""
ROUNDING_ULPS = 64
"""The tolerance's floor in units of the parameters' epsilon (fp32: 7.6e-6), whatever the measured rounding."""


@dataclass(frozen=True)
class Probe:
    """``input_ids / attention_mask / position_ids [B, P + R]``: left-padded prompts ++ right-padded responses."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response_length: int

    @property
    def valid(self) -> torch.Tensor:
        """``[B, R]`` bool: the real response tokens."""
        return self.attention_mask[:, -self.response_length:].bool()


def probe_rows(vocab_size: int, device: torch.device, *, groups=PROBE_GROUPS, seed: int = 0) -> Probe:
    """The probe: random token ids (fixed seed) in the layout the PPO batch stores."""
    gen = torch.Generator().manual_seed(seed)
    prompt_cols = max(p for p, _ in groups)
    response_cols = max(r for _, lengths in groups for r in lengths)
    ids, masks = [], []
    for prompt_len, lengths in groups:
        prompt = torch.randint(0, vocab_size, (prompt_len,), generator=gen)
        for length in lengths:
            row, mask = torch.zeros(prompt_cols + response_cols, dtype=torch.long), torch.zeros(
                prompt_cols + response_cols, dtype=torch.long)
            row[prompt_cols - prompt_len:prompt_cols] = prompt
            row[prompt_cols:prompt_cols + length] = torch.randint(0, vocab_size, (length,), generator=gen)
            mask[prompt_cols - prompt_len:prompt_cols + length] = 1
            ids.append(row)
            masks.append(mask)
    input_ids, attention_mask = torch.stack(ids).to(device), torch.stack(masks).to(device)
    return Probe(input_ids, attention_mask, (attention_mask.cumsum(-1) - 1).clamp(min=0), response_cols)


@dataclass(frozen=True)
class Verdict:
    """How far each tried layout is from the padded forward, the rounding allowed, and the layout that runs."""

    differences: dict[str, float]
    tolerance: float
    chosen: str
    features: dict[str, set[str]]


def checked_layout(model: torch.nn.Module, layout: str, *, key: str, chunked_head: bool = False) -> str:
    """``layout`` when the model's packed forward in it equals its padded forward on the probe, else the next
    layout that does (:data:`FALLBACKS`), said in one warning line. ``key``: the config section that chose it."""
    if layout == "padded":
        return layout
    verdict = probe_layouts(model, FALLBACKS[layout], chunked_head=chunked_head)
    if verdict.chosen != layout:
        logger.warning(disagreement_line(model, layout, verdict, key=key))
    return verdict.chosen


def probe_layouts(model: torch.nn.Module, layouts: tuple[str, ...], *, chunked_head: bool = False) -> Verdict:
    """Each of ``layouts`` against the padded forward on the probe, until one agrees (``padded`` always does)."""
    outputs = _outputs_of(model, chunked_head=chunked_head)
    probe = probe_rows(model.config.get_text_config().vocab_size, next(model.parameters()).device)
    was_training, implementation = model.training, model.config._attn_implementation
    model.eval()
    differences, chosen = {}, "padded"
    try:
        with torch.no_grad(), attention_kwargs_seen() as features:
            reference = outputs(probe, None)
            tolerance = rounding_tolerance(model, reference, _rows_alone(outputs, probe))
            for layout in layouts:
                if layout == "padded":
                    break
                differences[layout] = float((outputs(probe, layout) - reference).abs().max())
                _restore_implementation(model, implementation)
                if differences[layout] <= tolerance:
                    chosen = layout
                    break
    finally:
        _restore_implementation(model, implementation)
        model.train(was_training)
    return Verdict(differences, tolerance, chosen, {name: set(kwargs) for name, kwargs in features.items() if kwargs})


def disagreement_line(model: torch.nn.Module, layout: str, verdict: Verdict, *, key: str) -> str:
    """One line: which layout differs by how much, what the model passes that the packed attention ignores, what
    runs instead and how to choose it."""
    named = "; ".join(f"{cls} passes {', '.join(sorted(kwargs))}" for cls, kwargs in sorted(verdict.features.items()))
    feature = (f"its attention does what the packed layouts do not reproduce ({named})" if named else
               "its forward depends on more than each sequence's own tokens (no attention kwarg of its own: "
               "a layer that mixes the rows of a batch, or attention outside transformers' interface)")
    return (f"{key}: {type(model).__name__}'s {layout} layout differs from its padded forward by "
            f"{verdict.differences[layout]:.3g} on a probe (fp32 rounding allows {verdict.tolerance:.2g}): {feature}; "
            f"the {verdict.chosen} layout runs")


def _outputs_of(model: torch.nn.Module, *, chunked_head: bool) -> Callable[[Probe, str | None], torch.Tensor]:
    """``outputs(probe, layout)`` -> ``[K]`` per valid response token: log-probs for a causal LM (the actor's and
    the reference's forward, chunked head included), the backbone's last hidden state for a value model."""
    backbone = getattr(model, "backbone", None)
    if backbone is None:
        return lambda probe, layout: _log_probs(model, probe, layout, chunked_head=chunked_head)
    return lambda probe, layout: _hidden_states(model, backbone, probe, layout)


def _log_probs(model, probe: Probe, layout: str | None, *, chunked_head: bool) -> torch.Tensor:
    if layout is None:
        log_probs = compute_log_probs(model, input_ids=probe.input_ids, attention_mask=probe.attention_mask,
                                      position_ids=probe.position_ids, response_length=probe.response_length)[0]
    else:
        packed = PackedResponses(probe.input_ids, probe.attention_mask, response_length=probe.response_length,
                                 share_prompt=layout == "shared_prompt")
        log_probs = packed_log_probs(model, packed, chunked_head=chunked_head)[0]
    return log_probs[probe.valid].float()


def _hidden_states(model, backbone, probe: Probe, layout: str | None) -> torch.Tensor:
    """``[K, H]`` the backbone's last hidden state at the position that values each response token."""
    if layout is None:
        hidden = backbone(input_ids=probe.input_ids, attention_mask=probe.attention_mask,
                          position_ids=probe.position_ids, use_cache=False).last_hidden_state
        return hidden[:, -probe.response_length - 1:-1][probe.valid].float()
    packed = PackedResponses(probe.input_ids, probe.attention_mask, response_length=probe.response_length,
                             share_prompt=layout == "shared_prompt")
    hidden = backbone(**packed_forward_inputs(model, packed)).last_hidden_state[0, packed.source]
    order = torch.argsort(packed.rows * probe.response_length + packed.cols)  # packed order -> row-major order
    return hidden[order].float()


def _rows_alone(outputs, probe: Probe) -> torch.Tensor:
    """The outputs of each probe row run alone, unpadded (what the padded batch's rounding is measured against)."""
    pieces = []
    for row in range(probe.input_ids.shape[0]):
        keep = probe.attention_mask[row].bool()
        ids = probe.input_ids[row][keep][None]
        valid_response = int(probe.valid[row].sum())
        alone = Probe(ids, torch.ones_like(ids), torch.arange(ids.shape[1], device=ids.device)[None], valid_response)
        pieces.append(outputs(alone, None))
    return torch.cat(pieces)


def rounding_tolerance(model, reference: torch.Tensor, alone: torch.Tensor) -> float:
    """8x the padded batch's own rounding (against each row alone), at least :data:`ROUNDING_ULPS` epsilons of the
    parameters' dtype, scaled by the outputs' magnitude for hidden states."""
    dtype = next(model.parameters()).dtype
    scale = max(1.0, float(reference.abs().max())) if reference.dim() > 1 else 1.0
    floor = ROUNDING_ULPS * torch.finfo(dtype).eps * scale
    return max(floor, 8 * float((reference - alone).abs().max()))


def _restore_implementation(model: torch.nn.Module, implementation: str) -> None:
    """The packed forward switches the config to segment attention; the padded forward is the model's own."""
    model.config._attn_implementation = implementation


"""Pieces shared by the policy losses: the inputs every loss reads, how a loss is aggregated,
the clip knobs, the clamped importance ratio, PPO's clipped surrogate and the metrics every
loss reports.

A policy loss is ``fn(inputs: PolicyLossInputs, config: <its knobs>, agg: LossAggregation)
-> (loss, metrics)``; ``register_policy_loss(name, config=<its knobs>)`` turns it into the
flat keyword call the actor makes (see ``algos/registry.py``).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import torch

from hybridflow.algos.agg import agg_loss
from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.stats import masked_mean

# exp(20) ~ 5e8 is finite in fp32 and bf16; a larger log-ratio only means "far off-policy".
LOG_RATIO_BOUND = 20.0


def clamp_log_ratio(*, log_ratio: torch.Tensor) -> torch.Tensor:
    """``log_ratio`` ``[B, T]`` clamped to +-20 so that exp() stays finite."""
    return log_ratio.clamp(min=-LOG_RATIO_BOUND, max=LOG_RATIO_BOUND)


def clamped_log_ratio(*, log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    """log pi_theta - log pi_old ``[B, T]``, clamped to +-20 so that exp() stays finite."""
    return clamp_log_ratio(log_ratio=log_prob - old_log_prob)


def clip_range(
    *, clip_ratio: float, clip_ratio_low: float | None, clip_ratio_high: float | None
) -> tuple[float, float]:
    """(eps_low, eps_high): the decoupled bounds of DAPO's clip-higher, each defaulting to eps."""
    low = clip_ratio if clip_ratio_low is None else clip_ratio_low
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    if low < 0 or high < 0:
        raise AlgorithmError(f"clip ratios must be >= 0, got low={low}, high={high}; fix actor.clip_ratio_low/high")
    return low, high


def clipped_surrogate(
    *, ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's pessimistic surrogate (Schulman et al., arXiv 1707.06347, eq. 7) per token::

        l_t = max(-A_t rho_t, -A_t clip(rho_t, 1 - eps_low, 1 + eps_high))      [B, T]

    Returns ``(l, clipped)``; ``clipped`` ``[B, T]`` (bool) marks the tokens where the clipped
    term won, i.e. whose gradient the clip removed (the numerator of ``pg_clipfrac``).
    """
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_low, 1 + clip_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def policy_loss_metrics(
    *,
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    clipped: torch.Tensor | None = None,
    clipped_lower: torch.Tensor | None = None,
) -> dict[str, float]:
    """The metrics of every policy loss, masked token means of detached values.

    ``pg_clipfrac`` / ``pg_clipfrac_lower``: fraction of tokens in the bool masks ``clipped`` /
    ``clipped_lower`` ``[B, T]`` (0.0 for a loss without that clip); ``ppo_kl`` = mean(-log rho)
    = mean(log pi_old - log pi_theta), the k1 estimate, from ``log_ratio`` ``[B, T]``.
    """

    def fraction(tokens: torch.Tensor | None) -> float:
        return 0.0 if tokens is None else masked_mean(values=tokens.float(), mask=response_mask).item()

    return {
        "pg_clipfrac": fraction(clipped),
        "pg_clipfrac_lower": fraction(clipped_lower),
        "ppo_kl": masked_mean(values=-log_ratio.detach(), mask=response_mask).item(),
    }


def weight_by_rollout_is(*, losses: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    """Per-token losses ``[B, T]`` times the rollout-correction IS weights ``[B, T]`` (detached:
    they change the measure, not the objective); unchanged when there are none. See
    ``hybridflow.algos.rollout_correction``."""
    return losses if rollout_is_weights is None else losses * rollout_is_weights.detach()


def select_valid(*, log_prob: torch.Tensor, old_log_prob: torch.Tensor,
                 response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log_prob, old_log_prob)`` ``[B, T]`` with masked positions set to 0 (ratio 1 there).

    Masked positions are garbage by contract (an engine's log-prob of a tool observation it
    never sampled, padding): selected out before any exp or product, so that neither the loss
    nor the gradient (0 at masked positions) can turn NaN.
    """
    valid = response_mask.bool()
    return (torch.where(valid, log_prob, torch.zeros_like(log_prob)),
            torch.where(valid, old_log_prob, torch.zeros_like(old_log_prob)))


@dataclass(frozen=True)
class PolicyLossInputs:
    """The tensors every policy loss reads, each ``[B, T]``. Built by the registry's wrapper with the masked
    positions of both log-probs selected to 0 (``select_valid``), so no loss repeats that step."""

    old_log_prob: torch.Tensor
    log_prob: torch.Tensor
    advantages: torch.Tensor
    response_mask: torch.Tensor
    rollout_is_weights: torch.Tensor | None = None
    """Rollout-correction IS weights (detached inside ``LossAggregation``); None = 1."""
    index: Any = None
    """The group id of each row (len B: the prompt's ``uid``), for a loss over whole groups (GVPO); None = unknown."""

    @classmethod
    def valid(cls, *, old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
              response_mask: torch.Tensor, rollout_is_weights: torch.Tensor | None = None,
              index: Any = None) -> "PolicyLossInputs":
        log_prob, old_log_prob = select_valid(log_prob=log_prob, old_log_prob=old_log_prob,
                                              response_mask=response_mask)
        return cls(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask,
                   rollout_is_weights=rollout_is_weights, index=index)


@dataclass(frozen=True)
class LossAggregation:
    """How per-token losses become one number (``algos/agg.py``); the global counts come from the caller."""

    loss_agg_mode: str = "token-mean"
    global_num_tokens: float | None = None
    global_num_seqs: float | None = None
    max_response_length: int | None = None

    def __call__(self, losses: torch.Tensor, *, inputs: PolicyLossInputs) -> torch.Tensor:
        """agg(sg(w) * l) over ``inputs.response_mask``: ``losses`` ``[B, T]`` times the inputs' IS weights."""
        return agg_loss(loss_mat=weight_by_rollout_is(losses=losses, rollout_is_weights=inputs.rollout_is_weights),
                        loss_mask=inputs.response_mask,
                        **{field.name: getattr(self, field.name) for field in dataclasses.fields(self)})


@dataclass(frozen=True)
class ClipConfig:
    """PPO's ratio clip: eps, with DAPO's decoupled low / high bounds (each defaults to eps)."""

    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None

    def bounds(self) -> tuple[float, float]:
        """(eps_low, eps_high), each >= 0."""
        return clip_range(clip_ratio=self.clip_ratio, clip_ratio_low=self.clip_ratio_low,
                          clip_ratio_high=self.clip_ratio_high)


@dataclass(frozen=True)
class NoKnobs:
    """A loss without knobs of its own (GPG's REINFORCE)."""


def keyword_policy_loss(fn, config: type):
    """``fn(inputs, config, agg)`` as the flat keyword call every caller makes: ``old_log_prob``, ``log_prob``,
    ``advantages``, ``response_mask``, ``rollout_is_weights``, the ``LossAggregation`` fields and ``config``'s
    fields; other keywords (another loss's knobs) are ignored, so one call site serves every loss."""
    groups = {"inputs": _field_names(PolicyLossInputs), "config": _field_names(config),
              "agg": _field_names(LossAggregation)}

    @functools.wraps(fn)
    def policy_loss(**kwargs) -> tuple[torch.Tensor, dict[str, float]]:
        picked = {group: {k: v for k, v in kwargs.items() if k in names} for group, names in groups.items()}
        return fn(PolicyLossInputs.valid(**picked["inputs"]), config(**picked["config"]),
                  LossAggregation(**picked["agg"]))

    policy_loss.compute = fn
    policy_loss.config = config
    return policy_loss


def _field_names(cls: type) -> frozenset[str]:
    return frozenset(field.name for field in dataclasses.fields(cls))

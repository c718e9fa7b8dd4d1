"""The distillation losses' registry: each loss with the spec of what the teacher must give."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hybridflow.algos.registry import Registry

DISTILLATION_LOSSES = Registry("distillation loss")
_SPECS: dict[str, "DistillationLossSpec"] = {}


@dataclass(frozen=True)
class DistillationLossSpec:
    """What a distillation loss reads besides the student's sampled-token log-probs."""

    use_topk: bool = False
    """The teacher's top-k log-probs and token ids ``[B, T, K]`` and the student's full distribution at each
    response position (its log-probs of the teacher's top-k ids)."""


def register_distillation_loss(*names: str, use_topk: bool = False) -> Callable[[Callable], Callable]:
    """Decorator: make ``fn`` available as ``distillation.distillation_loss.loss_mode=<name>`` for each name."""
    spec = DistillationLossSpec(use_topk=use_topk)

    def decorator(fn: Callable) -> Callable:
        for name in names:
            DISTILLATION_LOSSES.register(name)(fn)
            _SPECS[name] = spec
        return fn

    return decorator


def get_distillation_loss(name: str) -> Callable:
    """The per-token loss registered as ``name`` (an unknown name raises, listing the registered ones)."""
    return DISTILLATION_LOSSES.get(name)


def distillation_loss_spec(name: str) -> DistillationLossSpec:
    DISTILLATION_LOSSES.get(name)
    return _SPECS[name]


def list_distillation_losses() -> list[str]:
    return DISTILLATION_LOSSES.names()

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
    needs_policy_gradient: bool = False
    """Backpropagated directly its gradient ignores the teacher (k1's ``log p - log q`` differentiates to the
    score function alone): only its policy-gradient form trains."""


def register_distillation_loss(*names: str, use_topk: bool = False,
                               needs_policy_gradient: bool = False) -> Callable[[Callable], Callable]:
    """Decorator: make ``fn`` available as ``distillation.distillation_loss.loss_mode=<name>`` for each name."""
    spec = DistillationLossSpec(use_topk=use_topk, needs_policy_gradient=needs_policy_gradient)

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


POLICY_LOSS_MODES = ("vanilla",)
"""The policy losses the policy-gradient form may use (verl 0.9.1: vanilla PPO only)."""


def distillation_loss_problems(key: str, loss_mode: str, *, use_policy_gradient: bool, policy_loss_mode: str,
                               topk: int | None) -> list[str]:
    """One line per setting of ``key`` (``distillation.distillation_loss``) that the chosen loss cannot train with."""
    if loss_mode not in DISTILLATION_LOSSES.names():
        return [f"{key}.loss_mode={loss_mode!r} is not one of {', '.join(DISTILLATION_LOSSES.names())}"]
    spec, problems = _SPECS[loss_mode], []
    if spec.needs_policy_gradient and not use_policy_gradient:
        problems.append(f"{key}.loss_mode={loss_mode} backpropagated directly has a gradient that ignores the "
                        "teacher: set use_policy_gradient=True or loss_mode=k3")
    if policy_loss_mode not in POLICY_LOSS_MODES:
        problems.append(f"{key}.policy_loss_mode={policy_loss_mode!r}: only vanilla is supported (as in verl 0.9.1)")
    if spec.use_topk and not (topk or 0) > 0:
        problems.append(f"{key}.topk={topk} must be a positive number of tokens for loss_mode={loss_mode}")
    return problems

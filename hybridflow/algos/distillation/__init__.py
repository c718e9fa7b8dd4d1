"""On-policy distillation losses (verl 0.9.1's ``distillation.distillation_loss.loss_mode``): the student samples,
a frozen teacher scores the student's tokens, and the student is pulled towards the teacher per token.

Each loss is registered with a :class:`DistillationLossSpec` saying what the teacher must give:

==========================  ==========================================  ======================================
loss_mode                   per-token loss ``[B, T]``                   teacher gives
==========================  ==========================================  ======================================
kl, k1 / abs / mse, k2 /    reverse-KL estimate of KL(student||teacher)  log q(y_t) ``[B, T]`` of the sampled
low_var_kl, k3              from the sampled token (``algos/kl.py``)      token (``estimators.py``)
forward_kl_topk             sum_k q_k (log q_k - log p_k) over the        its top-k log-probs and ids
                            teacher's top-k tokens                        ``[B, T, K]`` (``forward_kl_topk.py``)
==========================  ==========================================  ======================================

How a per-token loss becomes the actor's objective (clamp, policy gradient or supervised, with or without the
task's policy loss) is ``combine.py``.
"""

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


# registers the losses (imported last: they import the decorator above)
from hybridflow.algos.distillation import estimators as _estimators  # noqa: E402,F401
from hybridflow.algos.distillation import forward_kl_topk as _forward_kl_topk  # noqa: E402,F401
from hybridflow.algos.distillation.combine import DistillationObjective  # noqa: E402

__all__ = ["DistillationLossSpec", "DistillationObjective", "distillation_loss_spec", "get_distillation_loss",
           "list_distillation_losses", "register_distillation_loss"]

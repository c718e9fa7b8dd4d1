"""Per-token KL(pi || pi_ref) estimators (``algorithm.kl_ctrl`` / ``actor.kl_loss_type``).

From J. Schulman, "Approximating KL Divergence" (2020), with samples y ~ pi and the
log-ratio ``d = log pi(y) - log pi_ref(y)``:

==================  ===============================  =====================================
name                estimate                          notes
==================  ===============================  =====================================
kl, k1              d                                 unbiased, high variance, can be < 0
abs                 |d|
mse, k2             d^2 / 2                           biased, low variance, grad = d
low_var_kl, k3      exp(-d) + d - 1                   unbiased, >= 0; d clamped to [-20, 20]
                                                      and the result to [-10, 10] (as verl)
<name>+             value of <name>, gradient of k2   straight-through, for every name above
==================  ===============================  =====================================

k2's gradient ``d * grad log pi`` is the gradient of the true KL in expectation, which
is why the straight-through variants borrow it while reporting the unbiased value.
"""

from __future__ import annotations

import torch

from hybridflow.algos.registry import Registry

KL_PENALTIES = Registry("kl penalty")

# exp of a log-ratio outside this range is inf/0 in fp32 long before it is meaningful.
_LOG_RATIO_BOUND = 20.0
_K3_BOUND = 10.0


@KL_PENALTIES.register("kl")
@KL_PENALTIES.register("k1")
def _k1(*, log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio


@KL_PENALTIES.register("abs")
def _abs(*, log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio.abs()


@KL_PENALTIES.register("mse")
@KL_PENALTIES.register("k2")
def _k2(*, log_ratio: torch.Tensor) -> torch.Tensor:
    return 0.5 * log_ratio.square()


@KL_PENALTIES.register("low_var_kl")
@KL_PENALTIES.register("k3")
def _k3(*, log_ratio: torch.Tensor) -> torch.Tensor:
    ref_over_policy = (-log_ratio).clamp(min=-_LOG_RATIO_BOUND, max=_LOG_RATIO_BOUND)
    return (ref_over_policy.exp() - ref_over_policy - 1).clamp(min=-_K3_BOUND, max=_K3_BOUND)


def _straight_through(value_fn):
    def estimate(*, log_ratio: torch.Tensor) -> torch.Tensor:
        k2 = _k2(log_ratio=log_ratio)
        return k2 - k2.detach() + value_fn(log_ratio=log_ratio).detach()

    return estimate


# every estimator has a '+' form (verl strips any trailing '+'); k2+ is k2 itself.
for _name, _fn in (("kl", _k1), ("k1", _k1), ("abs", _abs), ("mse", _k2), ("k2", _k2), ("low_var_kl", _k3),
                   ("k3", _k3)):
    KL_PENALTIES.register(f"{_name}+")(_straight_through(_fn))


def list_kl_penalties() -> list[str]:
    return KL_PENALTIES.names()


def kl_penalty(*, logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate ``[B, T]`` of pi (``logprob`` ``[B, T]``) from pi_ref.

    ``kl_penalty`` names the estimator (table above); the result is not masked.
    """
    return KL_PENALTIES.get(kl_penalty)(log_ratio=logprob - ref_logprob)

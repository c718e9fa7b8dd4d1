"""Reverse-KL estimator losses (``loss_mode`` = kl, k1, abs, mse, k2, low_var_kl, k3).

With the student's sampled token y_t ~ p (the student), ``d_t = log p(y_t) - log q(y_t)`` (q: the teacher), the
per-token loss is Schulman's estimator of KL(p || q) named by ``loss_mode`` (``hybridflow.algos.kl``: k1 = d,
k2 = d^2 / 2, k3 = exp(-d) + d - 1 clamped as verl clamps it). Shapes: ``student_log_probs``,
``teacher_log_probs`` ``[B, T]`` -> ``[B, T]``, not masked. As in verl, k1 only makes sense as a reward
(``use_policy_gradient=True``): its gradient does not depend on the teacher.
"""

from __future__ import annotations

import torch

from hybridflow.algos.distillation.registry import register_distillation_loss
from hybridflow.algos.kl import kl_penalty

ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


def reverse_kl_estimate(*, loss_mode: str, student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor,
                        **_) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(per-token estimate ``[B, T]``, {}): the estimator ``loss_mode`` of KL(student || teacher)."""
    return kl_penalty(logprob=student_log_probs, ref_logprob=teacher_log_probs, kl_penalty=loss_mode), {}


register_distillation_loss("kl", "k1", needs_policy_gradient=True)(reverse_kl_estimate)
register_distillation_loss(*(name for name in ESTIMATORS if name not in ("kl", "k1")))(reverse_kl_estimate)

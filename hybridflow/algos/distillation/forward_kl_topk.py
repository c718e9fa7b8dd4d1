"""Forward KL over the teacher's top-k tokens (``loss_mode=forward_kl_topk``; Agarwal et al., GKD, 2306.13649).

At each response position t, with the teacher's top-k token ids ``v_1..v_K`` and log-probs ``log q_k``, and the
student's log-probs of the same ids ``log p_k`` (the student's full softmax, gathered)::

    l_t = max(0, sum_k q_k (log q_k - log p_k))        q_k = exp(log q_k)

Both log-probs are first clamped from below at ``log_prob_min_clamp`` when set. The top-k masses do not sum to
one, so the sum can be negative; it is clamped at 0 (as verl). Shapes: ``student_topk_log_probs``,
``teacher_topk_log_probs`` ``[B, T, K]`` -> ``[B, T]``; also the top-k masses ``sum_k p_k`` and ``sum_k q_k``
``[B, T]`` (verl's ``distillation/student_mass`` / ``teacher_mass``). Computed in fp32.
"""

from __future__ import annotations

import torch

from hybridflow.algos.distillation.registry import register_distillation_loss


@register_distillation_loss("forward_kl_topk", use_topk=True)
def forward_kl_topk(*, student_topk_log_probs: torch.Tensor, teacher_topk_log_probs: torch.Tensor,
                    log_prob_min_clamp: float | None = None, **_) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(per-token forward KL ``[B, T]``, {"student_mass", "teacher_mass"} ``[B, T]``); see the module docstring."""
    student = student_topk_log_probs.float()
    teacher = teacher_topk_log_probs.float()
    masses = {"student_mass": student.detach().exp().sum(-1), "teacher_mass": teacher.exp().sum(-1)}
    if log_prob_min_clamp is not None:
        student = student.clamp_min(log_prob_min_clamp)
        teacher = teacher.clamp_min(log_prob_min_clamp)
    losses = (teacher.exp() * (teacher - student)).sum(-1)
    return losses.clamp_min(0.0), masses

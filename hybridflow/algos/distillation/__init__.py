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

from hybridflow.algos.distillation.registry import (DISTILLATION_LOSSES, DistillationLossSpec,
                                                    distillation_loss_spec, get_distillation_loss,
                                                    list_distillation_losses, register_distillation_loss)
# registers the losses
from hybridflow.algos.distillation import estimators as _estimators  # noqa: F401
from hybridflow.algos.distillation import forward_kl_topk as _forward_kl_topk  # noqa: F401
from hybridflow.algos.distillation.combine import DistillationObjective

__all__ = ["DISTILLATION_LOSSES", "DistillationLossSpec", "DistillationObjective", "distillation_loss_spec",
           "get_distillation_loss", "list_distillation_losses", "register_distillation_loss"]

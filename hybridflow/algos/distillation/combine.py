"""The distillation term of the actor's loss, and how it joins the task's policy loss (verl 0.9.1's
``distillation_ppo_loss``).

With a per-token distillation loss ``l [B, T]`` (the registered ``loss_mode``), response mask ``m``::

    l      <- clamp(l, -loss_max_clamp, loss_max_clamp)        (when loss_max_clamp is set)
    L_dist  = vanilla PPO loss with advantages A = -stopgrad(l) and the distillation's own clip ratios
              (use_policy_gradient: the loss is a per-token reward, Thinking Machines' on-policy distillation)
            = agg(l, m)                                          (otherwise: supervised, GKD)
    L       = L_task + distillation_loss_coef * L_dist           (use_task_rewards)
            = L_dist                                             (otherwise; the task's pg, entropy and KL
                                                                  terms are dropped)

``agg`` is the actor's ``loss_agg_mode`` with the mini-batch's global counts (``algos/agg.py``). Metrics (verl's
names, without the ``actor/`` prefix the actor adds): ``distillation/loss``, ``loss_min`` / ``loss_max`` (of the
unclamped per-token loss over valid tokens), ``abs_loss`` (estimators), ``student_mass`` / ``teacher_mass``
(top-k), and with the policy gradient the PPO metrics as ``distillation/pg_clipfrac`` etc.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridflow.algos.agg import agg_loss
from hybridflow.algos.distillation.registry import distillation_loss_problems
from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.registry import get_policy_loss


@dataclass(frozen=True)
class DistillationObjective:
    """verl's ``distillation.distillation_loss`` section, as the actor applies it."""

    loss_mode: str = "k3"
    topk: int | None = 32
    use_task_rewards: bool = True
    distillation_loss_coef: float = 1.0
    loss_max_clamp: float | None = None
    log_prob_min_clamp: float | None = None
    use_policy_gradient: bool = False
    policy_loss_mode: str = "vanilla"
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = 0.2
    clip_ratio_high: float | None = 0.2

    def __post_init__(self):
        problems = distillation_loss_problems("distillation.distillation_loss", self.loss_mode,
                                              use_policy_gradient=self.use_policy_gradient,
                                              policy_loss_mode=self.policy_loss_mode, topk=self.topk)
        if problems:
            raise AlgorithmError("\n".join(problems))


def distillation_term(objective: DistillationObjective, per_token: torch.Tensor, *, log_prob: torch.Tensor,
                      old_log_prob: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str,
                      rollout_is_weights: torch.Tensor | None = None, **counts) -> tuple[torch.Tensor, dict]:
    """(L_dist, metrics) from the per-token loss ``per_token [B, T]`` (see the module docstring); ``counts``:
    ``global_num_tokens``, ``global_num_seqs``, ``max_response_length`` of the aggregation."""
    valid = per_token.detach()[response_mask.bool()]
    metrics = {"loss_min": valid.min().item(), "loss_max": valid.max().item()} if valid.numel() else {}
    if objective.loss_max_clamp is not None:
        per_token = per_token.clamp(min=-objective.loss_max_clamp, max=objective.loss_max_clamp)
    if not objective.use_policy_gradient:
        return agg_loss(loss_mat=per_token, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **counts), metrics
    loss, pg_metrics = get_policy_loss(objective.policy_loss_mode)(
        old_log_prob=old_log_prob, log_prob=log_prob, advantages=-per_token.detach(), response_mask=response_mask,
        loss_agg_mode=loss_agg_mode, clip_ratio=objective.clip_ratio, clip_ratio_low=objective.clip_ratio_low,
        clip_ratio_high=objective.clip_ratio_high, rollout_is_weights=rollout_is_weights, **counts)
    return loss, {**metrics, **pg_metrics}


def combined_loss(objective: DistillationObjective, *, task_loss: torch.Tensor,
                  distill_loss: torch.Tensor) -> torch.Tensor:
    """L = L_task + coef * L_dist with task rewards, else L_dist alone."""
    if objective.use_task_rewards:
        return task_loss + objective.distillation_loss_coef * distill_loss
    return distill_loss


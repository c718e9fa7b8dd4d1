"""The distillation teachers of one rank and the actor's distillation objective, from ``cfg.distillation``
(issue 60: verl 0.9.1's on-policy distillation)."""

from __future__ import annotations

import torch

from hybridflow.algos.distillation import DistillationObjective, distillation_loss_spec
from hybridflow.config.distillation import DEFAULT_ROUTE, resolved_teachers
from hybridflow.data.parallel import DataParallel
from hybridflow.errors import ConfigError
from hybridflow.models import load_causal_lm, load_tokenizer
from hybridflow.workers.micro_batches import per_rank_micro_batch_size
from hybridflow.workers.teacher import TeacherWorker


def distillation_of(cfg) -> DistillationObjective | None:
    """The actor's distillation term (None when ``distillation.enabled`` is false)."""
    if not cfg.distillation.enabled:
        return None
    loss = cfg.distillation.distillation_loss
    return DistillationObjective(
        loss_mode=loss.loss_mode, topk=loss.topk, use_task_rewards=loss.use_task_rewards,
        distillation_loss_coef=loss.distillation_loss_coef, loss_max_clamp=loss.loss_max_clamp,
        log_prob_min_clamp=loss.log_prob_min_clamp, use_policy_gradient=loss.use_policy_gradient,
        policy_loss_mode=loss.policy_loss_mode, clip_ratio=loss.clip_ratio, clip_ratio_low=loss.clip_ratio_low,
        clip_ratio_high=loss.clip_ratio_high)


def build_teacher(cfg, *, dp: DataParallel, device: torch.device, shard) -> TeacherWorker | None:
    """The teachers of one rank: each a frozen model in the reference's dtype, sharded as the reference
    (``shard(model)``), batched by the reference's log-prob micro-batch keys; None without distillation."""
    section = cfg.distillation
    if not section.enabled:
        return None
    student = cfg.actor_rollout_ref.model
    student_vocab = load_tokenizer(cfg.data.tokenizer or student.tokenizer_path or student.path).get_vocab()
    teachers = {}
    for key, path in resolved_teachers(section).items():
        if load_tokenizer(path).get_vocab() != student_vocab:
            raise ConfigError(f"distillation teacher '{path}' has another tokenizer than the student "
                              f"'{cfg.actor_rollout_ref.model.path}': teachers must share the student's vocabulary")
        model = load_causal_lm(path, dtype=cfg.actor_rollout_ref.ref.fsdp_config.model_dtype).to(device)
        teachers[key] = shard(model)
    ref = cfg.actor_rollout_ref.ref
    loss = section.distillation_loss
    return TeacherWorker(
        teachers=teachers, route_by=None if DEFAULT_ROUTE in teachers else section.teacher_key,
        topk=loss.topk if distillation_loss_spec(loss.loss_mode).use_topk else None,
        micro_batch_size=per_rank_micro_batch_size(ref.log_prob_micro_batch_size_per_gpu,
                                                   ref.log_prob_micro_batch_size, dp.world_size))

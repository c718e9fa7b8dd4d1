"""PRIME's implicit PRM as a role of the PPO trainer: its factory inside a rank, its worker group (colocated like the
critic). Its settings are checked by the ``prime`` estimator's spec (``algos/prime.py``) before any model loads. The
step stage that trains it and turns its log-probs into dense rewards (``batch["prm_rewards"]``, read by
``adv_estimator=prime``) is the PPO update's (``loop/ppo_update.py``).
"""

from __future__ import annotations

import functools

import torch

from hybridflow.config.verl_versions import optim_clip_grad
from hybridflow.controller.worker_group import build_worker_group
from hybridflow.data.parallel import DataParallel
from hybridflow.models.sharded_checkpoint import FSDPModelComponent
from hybridflow.trainer.roles.builders import (load_policy, model_layout, policy_tokenizer, rank_device, shard_for_group,
                                             training_precision)
from hybridflow.trainer.roles.groups import ImplicitPRMGroupWorker
from hybridflow.workers.implicit_prm import ImplicitPRMWorker
from hybridflow.workers.micro_batches import LogProbBatching, per_rank_micro_batch_size
from hybridflow.workers.optim import train_state_from_config
from hybridflow.workers.ppo_update import UpdateSchedule

def build_prm_worker(dp: DataParallel, *, cfg, total_steps: int) -> ImplicitPRMGroupWorker:
    """The implicit PRM of one rank: the policy's initial weights (FSDP2 across the group), its AdamW, checkpoint."""
    torch.manual_seed(cfg.trainer.seed)
    rm, arr, device = cfg.reward_model, cfg.actor_rollout_ref, rank_device()
    model = load_policy(cfg, device, gradient_checkpointing=rm.model.enable_gradient_checkpointing)
    layout = model_layout(arr.model, model, key="actor_rollout_ref.model")  # the reference's forward
    fsdp_cfg = rm.model.fsdp_config
    model = shard_for_group(model, dp=dp, fsdp_cfg=fsdp_cfg, device=device,
                            precision=training_precision(fsdp_cfg, arr.model.dtype, device=device))
    state = train_state_from_config(model, rm.model.optim, grad_clip=optim_clip_grad(rm.model.optim),
                                    total_steps=total_steps,
                                    offload_optimizer=fsdp_cfg.optimizer_offload)
    micro = per_rank_micro_batch_size(rm.micro_batch_size_per_gpu, rm.micro_batch_size, dp.world_size)
    schedule = UpdateSchedule(mini_batch_size=rm.mini_batch_size, rows_per_prompt=arr.rollout.n,
                              micro_batch_size=micro)
    prm = ImplicitPRMWorker(state=state, schedule=schedule, beta=rm.model.beta_train,
                            forward=LogProbBatching(micro_batch_size=micro), dp=dp, seed=cfg.trainer.seed,
                            layout=layout)
    checkpoint = FSDPModelComponent(model, state.optimizer, state.scheduler, tokenizer=policy_tokenizer(cfg))
    return ImplicitPRMGroupWorker(prm=prm, checkpoint=checkpoint)


def build_prm_group(cfg, *, total_steps: int, group_kwargs: dict):
    """The PRM's worker group (``group_kwargs``: the backend's, as the critic's)."""
    return build_worker_group(functools.partial(build_prm_worker, cfg=cfg, total_steps=total_steps),
                              worker_cls=ImplicitPRMGroupWorker, name="reward_model", **group_kwargs)

"""Role assembly of the PPO-family runs: datasets, worker groups (hybrid engine, split rollout, critic, PRM) on the
local or Ray backend, the reward worker, the trackers, and the loop with the parts an entry point chooses."""

from __future__ import annotations

import functools
import os
from typing import Any, Callable

from omegaconf import OmegaConf

from hybridflow.config import PPOConfig, critic_enabled, implicit_prm_enabled, reference_enabled, split_placement
from hybridflow.config.validate import as_list, generation_batch_size
from hybridflow.trainer.entry import partial_rollouts
from hybridflow.controller.resources import ResourcePool, pool_from_trainer_config
from hybridflow.controller.worker_group import build_worker_group
from hybridflow.data.dataloader import StatefulDataLoader
from hybridflow.data.rl_dataset import RLDataset
from hybridflow.trainer.entry import resolve_device, seed_everything
from hybridflow.trainer.loop.fit import Loop
from hybridflow.trainer.loop.parts import Parts, PPOWorkers, Run
from hybridflow.trainer.roles.builders import (build_critic_worker, build_hybrid_engine, build_rollout_worker,
                                             check_policy_vocab, policy_processor, policy_tokenizer)
from hybridflow.trainer.roles.groups import CriticGroupWorker, GroupCheckpoint, HybridEngineWorker, RolloutGroupWorker
from hybridflow.trainer.roles.prime import build_prm_group
from hybridflow.trainer.roles.reward import build_reward_worker, check_reward_inputs, stop_token_ids
from hybridflow.trainer.tracking.trackers import Tracking


def build_datasets(cfg: PPOConfig, tokenizer):
    """(train loader, val loader or None) over verl-schema parquet/jsonl files."""
    data = cfg.data
    processor = policy_processor(cfg, tokenizer)  # a vision-language policy's: rows carry images

    def dataset(files, max_samples):
        return RLDataset(files, tokenizer=tokenizer, prompt_key=data.prompt_key, max_prompt_length=data.max_prompt_length,
                         processor=processor, image_key=data.image_key, video_key=data.video_key,
                         filter_overlong_prompts=data.filter_overlong_prompts, truncation=data.truncation,
                         max_samples=max_samples, apply_chat_template_kwargs=dict(data.apply_chat_template_kwargs),
                         reward_fn_key=data.reward_fn_key, image_patch_size=data.image_patch_size,
                         return_raw_chat=data.return_raw_chat or cfg.reward_model.enable
                         or cfg.actor_rollout_ref.rollout.multi_turn.enable)

    max_train = data.train_max_samples if data.train_max_samples > 0 else data.max_samples
    train = dataset(data.train_files, max_train)
    train_loader = StatefulDataLoader(train, batch_size=generation_batch_size(data),
                                      collate_fn=train.collate_fn,
                                      shuffle=data.shuffle, seed=data.seed, drop_last=True)
    if not data.val_files:
        return train_loader, None
    val = dataset(data.val_files, data.val_max_samples)
    val_loader = StatefulDataLoader(val, batch_size=data.val_batch_size or len(val), collate_fn=val.collate_fn,
                                    shuffle=data.validation_shuffle, seed=data.seed, drop_last=False)
    return train_loader, val_loader


def total_training_steps(cfg: PPOConfig, steps_per_epoch: int) -> int:
    steps = steps_per_epoch * cfg.trainer.total_epochs
    if cfg.trainer.total_training_steps is not None:
        steps = cfg.trainer.total_training_steps
    return steps


def build_worker_groups(cfg: PPOConfig, *, total_steps: int):
    """(actor/reference group, rollout group, critic group or None, implicit PRM group or None) on ``trainer.backend``.

    The actor, rollout and reference share one group (the hybrid engine) unless ``rollout.n_gpus_per_node``
    places the rollout in its own pool (split placement); ``local`` runs the group in this process at world
    size 1, ``ray`` as ``nnodes x n_gpus_per_node`` FSDP2 ranks.
    """
    built: list = []
    try:
        return _build_groups(cfg, total_steps=total_steps, built=built)
    except BaseException:
        for group in built:  # a group that cannot be placed must not leave the others holding the cluster
            group.shutdown()
        raise


def _build_groups(cfg: PPOConfig, *, total_steps: int, built: list):
    backend, kwargs = cfg.trainer.backend, ray_group_kwargs(cfg)
    split = split_placement(cfg)
    # On Ray the training groups share each bundle of the actor's placement group: half each with a critic.
    colocated = {"share": 1.0 / (1 + critic_enabled(cfg) + implicit_prm_enabled(cfg))} if backend == "ray" else {}
    engine = build_worker_group(functools.partial(build_hybrid_engine, cfg=cfg, total_steps=total_steps,
                                                  with_rollout=not split),
                                worker_cls=HybridEngineWorker, backend=backend, name="actor_rollout_ref",
                                ranks_per_shard=cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size,
                                **kwargs, **colocated)
    built.append(engine)
    rollout = engine
    if split:
        pool = ResourcePool(nnodes=cfg.rollout.nnodes, procs_per_node=cfg.rollout.n_gpus_per_node,
                            cpus_per_proc=kwargs["pool"].cpus_per_proc, gpus_per_proc=kwargs["pool"].gpus_per_proc)
        # Partial rollouts: a rollout actor takes the weight sync in a second thread while its generate runs.
        concurrency = 2 if partial_rollouts(cfg) else 1
        rollout = build_worker_group(functools.partial(build_rollout_worker, cfg=cfg), worker_cls=RolloutGroupWorker,
                                     backend=backend, name="rollout", **dict(kwargs, pool=pool, concurrency=concurrency))
        built.append(rollout)
    critic = prm = None
    if backend == "ray":  # colocated with the actor: a share of each of its bundles
        kwargs = dict(kwargs, placement_group=engine.backend.placement_group, **colocated)
    if critic_enabled(cfg):
        critic = build_worker_group(functools.partial(build_critic_worker, cfg=cfg, total_steps=total_steps),
                                    worker_cls=CriticGroupWorker, backend=backend, name="critic",
                                    ranks_per_shard=cfg.critic.ulysses_sequence_parallel_size, **kwargs)
        built.append(critic)
    if implicit_prm_enabled(cfg):
        prm = build_prm_group(cfg, total_steps=total_steps, group_kwargs=dict(kwargs, backend=backend))
    return engine, rollout, critic, prm


def ray_group_kwargs(cfg: PPOConfig) -> dict[str, Any]:
    """Resource pool and cluster address of the Ray backend (nothing for ``local``)."""
    if cfg.trainer.backend != "ray":
        return {}

    ray_init = cfg.ray_kwargs.ray_init
    pool = pool_from_trainer_config(cfg.trainer, use_gpu=resolve_device(cfg.trainer.device).type == "cuda",
                                    cpus_per_proc=cfg.ray_kwargs.cpus_per_worker)
    return {"pool": pool, "ray_address": ray_init.address, "ray_num_cpus": ray_init.num_cpus,
            "ray_runtime_env": dict(ray_init.runtime_env),
            "timeout_s": float(cfg.trainer.ray_wait_register_center_timeout)}


def build_loop(cfg: PPOConfig, *, parts: Callable[[Run], Parts], count_steps=total_training_steps) -> Loop:
    """The loop with the workers, data and trackers of a validated config, and the parts ``parts(run)`` chooses
    (an entry point's choice, e.g. ``main_ppo.ppo_parts``)."""
    seed_everything(cfg.trainer.seed)
    device = resolve_device(cfg.trainer.device)
    tokenizer = policy_tokenizer(cfg)
    check_policy_vocab(cfg, tokenizer)
    train_loader, val_loader = build_datasets(cfg, tokenizer)
    check_reward_inputs(cfg, {"data.train_files": train_loader, "data.val_files": val_loader})
    total_steps = count_steps(cfg, len(train_loader))
    engine, rollout, critic, prm = build_worker_groups(cfg, total_steps=total_steps)
    workers = PPOWorkers(actor=engine, rollout=rollout, reward=build_reward_worker(cfg, tokenizer),
                         reference=engine if reference_enabled(cfg) else None, critic=critic, implicit_prm=prm,
                         teacher=engine if cfg.distillation.enabled else None)
    # the PRM under "reward", the recipe's folder name
    components = {"actor": GroupCheckpoint(engine), **({"critic": GroupCheckpoint(critic)} if critic else {}),
                  **({"reward": GroupCheckpoint(prm)} if prm else {})}
    run = Run(cfg=cfg, workers=workers, train_loader=train_loader, val_loader=val_loader, tokenizer=tokenizer,
              device=device, total_steps=total_steps,
              stop_token_ids=stop_token_ids(cfg.actor_rollout_ref.model.path, tokenizer))
    return Loop(run, parts(run), tracking=build_tracking(cfg), checkpoint_components=components)


def build_tracking(cfg):
    """The trackers of ``trainer.logger``, recording the resolved config; file backends write under logs/."""
    return Tracking(cfg.trainer.project_name, cfg.trainer.experiment_name, as_list(cfg.trainer.logger),
                    config=OmegaConf.to_container(OmegaConf.structured(cfg)),
                    local_dir=os.path.join(cfg.trainer.default_local_dir, "logs"),
                    tensorboard_dir=cfg.trainer.tensorboard_dir)

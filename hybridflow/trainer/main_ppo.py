"""``python -m hybridflow.trainer.main_ppo key=value ...``: build the PPO workers from a config and train.

Order matters for the user: everything that can be checked without loading a model
(keys, types, batch arithmetic, files, registered names, the model's context length
from its config.json) is checked first, so a typo costs a second, not a model load.
"""

from __future__ import annotations

import os
import random
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hybridflow.config import PPOConfig, critic_enabled, load_config, split_config_args, validate_ppo_config
from hybridflow.config.validate import as_list
from hybridflow.errors import ConfigError, run_entry_point
from hybridflow.trainer.ppo import PPOTrainer, PPOWorkers


# ------------------------------------------------------------------ checks before loading
def check_registered_names(cfg: PPOConfig) -> None:
    """Names that live in registries: each unknown one is an error listing the valid ones."""
    from hybridflow.algos import get_advantage, get_policy_loss, list_kl_penalties, list_loss_agg_modes
    from hybridflow.algos.errors import UnknownAlgorithmError
    from hybridflow.rollout.engine import ENGINES
    from hybridflow.trainer.tracking import available_backends

    actor = cfg.actor_rollout_ref.actor
    problems = []
    for lookup in (lambda: get_advantage(cfg.algorithm.adv_estimator),
                   lambda: get_policy_loss(actor.policy_loss.loss_mode)):
        try:
            lookup()
        except UnknownAlgorithmError as err:
            problems.append(str(err))
    checks = (("actor_rollout_ref.actor.loss_agg_mode", actor.loss_agg_mode, list_loss_agg_modes()),
              ("actor_rollout_ref.actor.kl_loss_type", actor.kl_loss_type, list_kl_penalties()),
              ("algorithm.kl_penalty", cfg.algorithm.kl_penalty, list_kl_penalties()),
              ("actor_rollout_ref.rollout.name", cfg.actor_rollout_ref.rollout.name, sorted(ENGINES)))
    for key, value, names in checks:
        if value not in names:
            problems.append(f"{key}={value!r} is not one of {', '.join(names)}")
    for name in as_list(cfg.trainer.logger):
        if name not in available_backends():
            problems.append(f"trainer.logger: unknown backend {name!r}; choose from {', '.join(available_backends())}")
    if problems:
        raise ConfigError("\n".join(problems))


def model_context_length(path: str, trust_remote_code: bool) -> int | None:
    """max_position_embeddings from the model's config (no weights loaded)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(os.path.expanduser(path), trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return None  # the loader reports an unreadable model with its own message
    return getattr(config, "max_position_embeddings", None)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device=cuda but no CUDA device is available: use trainer.device=cpu or auto")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# ------------------------------------------------------------------ building the parts
def build_datasets(cfg: PPOConfig, tokenizer):
    """(train loader, val loader or None) over verl-schema parquet/jsonl files."""
    from hybridflow.data.dataloader import StatefulDataLoader
    from hybridflow.data.rl_dataset import RLDataset

    data = cfg.data

    def dataset(files, max_samples):
        return RLDataset(files, tokenizer=tokenizer, prompt_key=data.prompt_key, max_prompt_length=data.max_prompt_length,
                         filter_overlong_prompts=data.filter_overlong_prompts, truncation=data.truncation,
                         max_samples=max_samples, apply_chat_template_kwargs=dict(data.apply_chat_template_kwargs),
                         return_raw_chat=data.return_raw_chat or cfg.reward_model.enable)

    max_train = data.train_max_samples if data.train_max_samples > 0 else data.max_samples
    train = dataset(data.train_files, max_train)
    train_loader = StatefulDataLoader(train, batch_size=data.train_batch_size, collate_fn=train.collate_fn,
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
    """(actor/rollout/reference group, critic group or None) on ``trainer.backend``.

    The actor, rollout and reference share one group (the hybrid engine); ``local`` runs it
    in this process at world size 1, ``ray`` as ``nnodes x n_gpus_per_node`` FSDP2 ranks.
    """
    import functools

    from hybridflow.controller.builders import build_critic_worker, build_hybrid_engine
    from hybridflow.controller.roles import CriticGroupWorker, HybridEngineWorker
    from hybridflow.controller.worker_group import build_worker_group

    backend, kwargs = cfg.trainer.backend, ray_group_kwargs(cfg)
    engine = build_worker_group(functools.partial(build_hybrid_engine, cfg=cfg, total_steps=total_steps),
                                worker_cls=HybridEngineWorker, backend=backend, name="actor_rollout_ref", **kwargs)
    critic = None
    if critic_enabled(cfg):
        if backend == "ray":  # colocated with the actor: same bundles, half of each
            kwargs = dict(kwargs, placement_group=engine.backend.placement_group, share=0.5)
        critic = build_worker_group(functools.partial(build_critic_worker, cfg=cfg, total_steps=total_steps),
                                    worker_cls=CriticGroupWorker, backend=backend, name="critic", **kwargs)
    return engine, critic


def ray_group_kwargs(cfg: PPOConfig) -> dict[str, Any]:
    """Resource pool and cluster address of the Ray backend (nothing for ``local``)."""
    if cfg.trainer.backend != "ray":
        return {}
    from hybridflow.controller.resources import pool_from_trainer_config

    ray_init = cfg.ray_kwargs.ray_init
    pool = pool_from_trainer_config(cfg.trainer, use_gpu=resolve_device(cfg.trainer.device).type == "cuda",
                                    cpus_per_proc=cfg.ray_kwargs.cpus_per_worker)
    return {"pool": pool, "ray_address": ray_init.address, "ray_num_cpus": ray_init.num_cpus,
            "timeout_s": float(cfg.trainer.ray_wait_register_center_timeout)}


def stop_token_ids(path: str, tokenizer) -> list[int]:
    """EOS of the tokenizer plus the model's generation-config EOS ids (chat models often have several)."""
    from transformers import GenerationConfig

    ids = {tokenizer.eos_token_id}
    try:
        eos = GenerationConfig.from_pretrained(os.path.expanduser(path)).eos_token_id
    except OSError:
        eos = None
    ids.update(eos if isinstance(eos, list) else [eos])
    return sorted(i for i in ids if i is not None)


def build_reward_worker(cfg: PPOConfig, tokenizer):
    """The configured manager around the built-in scorers or ``custom_reward_function``."""
    from hybridflow.rewards import build_reward_manager, load_reward_function
    from hybridflow.workers.reward import RewardWorker

    rm = cfg.reward_model
    compute_score = None
    if cfg.custom_reward_function.path:
        compute_score = load_reward_function(cfg.custom_reward_function.path, cfg.custom_reward_function.name)
    kwargs: dict[str, Any] = dict(compute_score=compute_score, reward_kwargs=dict(rm.reward_kwargs) or None,
                                  failure_score=rm.failure_score, timeout_s=rm.timeout_s)
    kwargs.update(MANAGER_SPECIFIC.get(rm.reward_manager, lambda _: {})(cfg))
    manager = build_reward_manager(rm.reward_manager, **kwargs)
    return RewardWorker(manager=manager, tokenizer=tokenizer, reward_fn_key=cfg.data.reward_fn_key,
                        model_scorer=build_reward_model_scorer(cfg) if rm.enable else None)


def build_reward_model_scorer(cfg: PPOConfig):
    """A sequence-classification reward model scoring (prompt, response) in its own chat template."""
    from hybridflow.models import load_reward_model, load_tokenizer
    from hybridflow.models.loader import import_external_lib
    from hybridflow.rewards import RewardModelScorer

    rm = cfg.reward_model
    if not rm.model.path:
        raise ConfigError("reward_model.enable=True needs reward_model.model.path (a sequence-classification model)")
    import_external_lib(rm.model.external_lib)
    tokenizer = load_tokenizer(rm.model.path, trust_remote_code=rm.model.trust_remote_code)
    model = load_reward_model(rm.model.path, trust_remote_code=rm.model.trust_remote_code,
                              pad_token_id=tokenizer.pad_token_id)
    return RewardModelScorer(model=model, tokenizer=tokenizer, max_length=rm.max_length,
                             micro_batch_size=rm.micro_batch_size_per_gpu or rm.micro_batch_size or 8)


MANAGER_SPECIFIC = {
    "parallel": lambda cfg: {"num_workers": cfg.reward_model.num_workers},
    "dapo": lambda cfg: {"max_response_length": cfg.data.max_response_length,
                         "overlong_buffer_len": cfg.reward_model.overlong_buffer.len,
                         "penalty_factor": cfg.reward_model.overlong_buffer.penalty_factor,
                         "enable_overlong_buffer": cfg.reward_model.overlong_buffer.enable},
}
"""Keyword arguments only some reward managers take, by ``reward_model.reward_manager``."""


def build_trainer(cfg: PPOConfig) -> PPOTrainer:
    """Everything the loop needs, from a validated config."""
    from hybridflow.controller.builders import policy_tokenizer
    from hybridflow.controller.roles import GroupCheckpoint
    from hybridflow.trainer.tracking import Tracking
    from omegaconf import OmegaConf

    seed_everything(cfg.trainer.seed)
    device = resolve_device(cfg.trainer.device)
    tokenizer = policy_tokenizer(cfg)
    train_loader, val_loader = build_datasets(cfg, tokenizer)
    total_steps = total_training_steps(cfg, len(train_loader))
    engine, critic = build_worker_groups(cfg, total_steps=total_steps)
    uses_reference = cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward
    workers = PPOWorkers(actor=engine, rollout=engine, reward=build_reward_worker(cfg, tokenizer),
                         reference=engine if uses_reference else None, critic=critic)
    components = {"actor": GroupCheckpoint(engine), **({"critic": GroupCheckpoint(critic)} if critic else {})}
    tracking = Tracking(cfg.trainer.project_name, cfg.trainer.experiment_name, as_list(cfg.trainer.logger),
                        config=OmegaConf.to_container(OmegaConf.structured(cfg)),
                        local_dir=os.path.join(cfg.trainer.default_local_dir, "logs"))
    return PPOTrainer(cfg=cfg, workers=workers, train_loader=train_loader, val_loader=val_loader, tracking=tracking,
                      tokenizer=tokenizer, total_steps=total_steps, device=device, checkpoint_components=components,
                      stop_token_ids=stop_token_ids(cfg.actor_rollout_ref.model.path, tokenizer))


@dataclass
class PPORun:
    """What a finished run leaves: per-step metrics, the last step's metrics and the plot files."""

    history: list[dict[str, float]]
    last: dict[str, float]
    steps: int
    plots: list[str]


def run_ppo(cfg: PPOConfig) -> PPORun:
    """Validate, build, train; print the summary and write the plots."""
    from hybridflow.trainer.plots import plot_curves
    from hybridflow.trainer.summary import summary_table

    check_registered_names(cfg)
    validate_ppo_config(cfg, model_max_len=model_context_length(cfg.actor_rollout_ref.model.path,
                                                                cfg.actor_rollout_ref.model.trust_remote_code))
    trainer = build_trainer(cfg)
    try:
        last = trainer.fit()
    finally:
        trainer.close()
    history = trainer.tracking.history
    print(summary_table(history))
    plots = plot_curves(history, os.path.join(cfg.trainer.default_local_dir, "plots"))
    return PPORun(history=history, last=last, steps=trainer.global_step, plots=plots)


def run_from_args(args: list[str]) -> int:
    """``[--config-path D --config-name N] key=value ...`` -> a run (shared by ``hybridflow ppo``)."""
    config_file, overrides = split_config_args(args)
    run_ppo(load_config(PPOConfig, overrides, config_file))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_entry_point(run_from_args, list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())

"""The self-play runs (SPIN, SPPO): their pre-load checks and their assembly.

The builder assembles the workers like ``main_ppo`` does, with a reference that owns its weights (so it can be
refreshed and checkpointed) and no critic, and chooses the parts: a synchronous source, a weight sync after every
update, and the preference update (``loop/preference_update.py``) of the method.
"""

from __future__ import annotations

import functools
from typing import Callable

from hybridflow.config import split_placement, validate_ppo_config
from hybridflow.config.selfplay import resolve_legacy_micro_batch_sizes, self_play_problems, warn_keys_without_effect
from hybridflow.config.validate import ppo_world_size, raise_if_problems
from hybridflow.controller.worker_group import build_worker_group
from hybridflow.models import load_tokenizer
from hybridflow.trainer.entry import engine_and_logger_problems, model_context_length, resolve_device, seed_everything
from hybridflow.trainer.loop.fit import Loop, train_and_report
from hybridflow.trainer.loop.generation import Generation, PromptStream
from hybridflow.trainer.loop.parts import Parts, PPOWorkers, Run
from hybridflow.trainer.loop.preference_update import REFERENCE_COMPONENT, PreferenceUpdate, SelfPlayMethod
from hybridflow.trainer.loop.sync_sources import SyncSource
from hybridflow.trainer.loop.weight_sync import AfterEveryUpdate
from hybridflow.trainer.roles.assembly import build_datasets, build_tracking, ray_group_kwargs, total_training_steps
from hybridflow.trainer.roles.builders import build_hybrid_engine
from hybridflow.trainer.roles.groups import GroupCheckpoint, HybridEngineWorker
from hybridflow.trainer.roles.reward import build_reward_worker, stop_token_ids
from hybridflow.trainer.tracking.trackers import EveryNthStep


def build_self_play_trainer(cfg, method: Callable[[Run], SelfPlayMethod]) -> Loop:
    """Workers, data and trackers for a self-play run, from a validated SPIN / SPPO config: a synchronous source,
    a weight sync after every update, and the preference update of ``method(run)``."""
    seed_everything(cfg.trainer.seed)
    device = resolve_device(cfg.trainer.device)
    tokenizer = load_tokenizer(cfg.data.tokenizer or cfg.actor_rollout_ref.model.path,
                               trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code)
    train_loader, val_loader = build_datasets(cfg, tokenizer)
    total_steps = total_training_steps(cfg, len(train_loader))
    factory = functools.partial(build_hybrid_engine, cfg=cfg, total_steps=total_steps, with_reference=True)
    engine = build_worker_group(factory, worker_cls=HybridEngineWorker, backend=cfg.trainer.backend,
                                name="actor_rollout_ref", **ray_group_kwargs(cfg))
    workers = PPOWorkers(actor=engine, rollout=engine, reward=build_reward_worker(cfg, tokenizer),
                         reference=engine)
    components = {"actor": GroupCheckpoint(engine)}
    if cfg.trainer.ref_update_freq > 0:
        components[REFERENCE_COMPONENT] = GroupCheckpoint(engine, save="save_reference", load="load_reference")
    run = Run(cfg=cfg, workers=workers, train_loader=train_loader, val_loader=val_loader, tokenizer=tokenizer,
              device=device, total_steps=total_steps,
              stop_token_ids=stop_token_ids(cfg.actor_rollout_ref.model.path, tokenizer))
    parts = Parts(source=SyncSource(Generation(run), PromptStream(train_loader)), sync=AfterEveryUpdate(workers),
                  update=PreferenceUpdate(run, method(run)), validation_every=cfg.trainer.test_freq)
    tracking = EveryNthStep(build_tracking(cfg), cfg.trainer.log_freq)
    return Loop(run, parts, tracking=tracking, checkpoint_components=components)


def check_self_play_config(cfg, *, schema: type, trainer: str, min_n: int = 2,
                           hints: dict[str, str] | None = None) -> None:
    """Everything checkable before a model loads: PPO's checks, the self-play ones, legacy sizes; warns for
    keys without effect."""
    problems = engine_and_logger_problems(cfg)
    problems += resolve_legacy_micro_batch_sizes(cfg, world_size=ppo_world_size(cfg))
    problems += self_play_problems(cfg, min_n=min_n)
    if split_placement(cfg):
        problems.append(f"rollout.n_gpus_per_node={cfg.rollout.n_gpus_per_node}: the {trainer} trainer runs the "
                        "rollout inside the training processes (hybrid engine); set rollout.n_gpus_per_node=0")
    raise_if_problems(problems)
    warn_keys_without_effect(cfg, schema, trainer=trainer, hint=hints)
    arr = cfg.actor_rollout_ref
    validate_ppo_config(cfg, model_max_len=model_context_length(arr.model.path, arr.model.trust_remote_code))


def run_self_play(cfg, *, schema: type, method: Callable[[Run], SelfPlayMethod], trainer: str, min_n: int = 2,
                  hints: dict[str, str] | None = None):
    """Check, build, train, report (``main_spin`` / ``main_sppo``); ``trainer`` names the method in messages."""
    check_self_play_config(cfg, schema=schema, trainer=trainer, min_n=min_n, hints=hints)
    return train_and_report(build_self_play_trainer(cfg, method), cfg)


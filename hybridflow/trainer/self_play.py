"""What the self-play trainers (SPIN, SPPO) share beyond the PPO trainer's loop.

``SelfPlayTrainer`` is ``PPOTrainer`` (fit, validation, checkpoints, resume, sampling
seeds, rollout + scoring) with a different ``train_step``; this module holds the parts of
that step both self-play methods run: refreshing the reference at iteration boundaries,
the reference's sequence log-probs, the preference update and the weight sync. The
builder assembles the workers like ``main_ppo`` does, with a reference that owns its
weights (so it can be refreshed and checkpointed) and no critic.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

from hybridflow.algos import masked_sum
from hybridflow.config import split_placement, validate_ppo_config
from hybridflow.config.selfplay import resolve_legacy_micro_batch_sizes, self_play_problems, warn_keys_without_effect
from hybridflow.config.validate import ppo_world_size, raise_if_problems
from hybridflow.controller.worker_group import build_worker_group
from hybridflow.data.batch import Batch
from hybridflow.models import load_tokenizer
from hybridflow.trainer import main_ppo
from hybridflow.trainer.entry import model_context_length, resolve_device, seed_everything
from hybridflow.trainer.main_ppo import train_and_report
from hybridflow.trainer.metrics import Timer
from hybridflow.trainer.ppo import PPOTrainer, PPOWorkers
from hybridflow.trainer.ppo_builders import build_hybrid_engine
from hybridflow.trainer.ppo_roles import GroupCheckpoint, HybridEngineWorker

REFERENCE_COMPONENT = "ref"
"""Checkpoint component of a refreshed reference: ``global_step_N/ref`` beside ``global_step_N/actor``."""


def reference_refresh_due(step: int, ref_update_freq: int) -> bool:
    """verl's recipes: the reference becomes the actor at the start of steps divisible by ref_update_freq."""
    return ref_update_freq > 0 and step % ref_update_freq == 0


class SelfPlayTrainer(PPOTrainer):
    """PPOTrainer's loop with a self-play step; subclasses write ``train_step`` with these pieces."""

    def refresh_reference_if_due(self, *, step: int, timer: Timer) -> None:
        if reference_refresh_due(step, self.cfg.trainer.ref_update_freq):
            with timer("update_ref"):
                self.w.reference.refresh_reference()

    def update_actor(self, batch: Batch, *, objective: str, params: dict[str, Any], rows_per_prompt: int,
                     step: int, timer: Timer) -> dict[str, float]:
        """Reference sequence log-probs, the preference update, then the new weights into the engine."""
        temperature = self.rollout_cfg.temperature
        with timer("ref"):
            ref = self.w.reference.compute_ref_log_prob(batch, temperature=temperature)
            batch["ref_seq_log_prob"] = masked_sum(values=ref, mask=batch["response_mask"], dim=-1)
        with timer("update_actor"):
            metrics = self.w.actor.update_preference(batch, objective=objective, params=params,
                                                     rows_per_prompt=rows_per_prompt, temperature=temperature,
                                                     step=step)
        with timer("sync_weights"):
            self.push_weights_to_rollout()
        return metrics


class EveryNthStep:
    """A tracking front that forwards step metrics only every ``log_freq`` steps (``+trainer.log_freq``).

    Validation before training (step 0) always goes through."""

    def __init__(self, tracking, log_freq: int):
        self.tracking, self.log_freq = tracking, log_freq

    @property
    def history(self) -> list[dict[str, float]]:
        return self.tracking.history

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        if step % self.log_freq == 0:
            self.tracking.log(metrics, step=step)

    def progress(self, total_steps: int, initial_step: int = 0):
        return self.tracking.progress(total_steps, initial_step=initial_step)

    def resume_at(self, step: int) -> None:
        self.tracking.resume_at(step)

    def finish(self) -> None:
        self.tracking.finish()


def build_self_play_trainer(cfg, trainer_cls: type[SelfPlayTrainer]) -> SelfPlayTrainer:
    """Workers, data and trackers for a self-play trainer, from a validated SPIN / SPPO config."""
    seed_everything(cfg.trainer.seed)
    device = resolve_device(cfg.trainer.device)
    tokenizer = load_tokenizer(cfg.data.tokenizer or cfg.actor_rollout_ref.model.path,
                               trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code)
    train_loader, val_loader = main_ppo.build_datasets(cfg, tokenizer)
    total_steps = main_ppo.total_training_steps(cfg, len(train_loader))
    factory = functools.partial(build_hybrid_engine, cfg=cfg, total_steps=total_steps, with_reference=True)
    engine = build_worker_group(factory, worker_cls=HybridEngineWorker, backend=cfg.trainer.backend,
                                name="actor_rollout_ref", **main_ppo.ray_group_kwargs(cfg))
    workers = PPOWorkers(actor=engine, rollout=engine, reward=main_ppo.build_reward_worker(cfg, tokenizer),
                         reference=engine)
    components = {"actor": GroupCheckpoint(engine)}
    if cfg.trainer.ref_update_freq > 0:
        components[REFERENCE_COMPONENT] = GroupCheckpoint(engine, save="save_reference", load="load_reference")
    tracking = EveryNthStep(main_ppo.build_tracking(cfg), cfg.trainer.log_freq)
    return trainer_cls(cfg=cfg, workers=workers, train_loader=train_loader, val_loader=val_loader, tracking=tracking,
                       tokenizer=tokenizer, total_steps=total_steps, device=device, checkpoint_components=components,
                       stop_token_ids=main_ppo.stop_token_ids(cfg.actor_rollout_ref.model.path, tokenizer))


def check_self_play_config(cfg, *, schema: type, trainer: str, min_n: int = 2,
                           hints: dict[str, str] | None = None) -> None:
    """Everything checkable before a model loads: PPO's checks, the self-play ones, legacy sizes; warns for
    keys without effect."""
    problems = main_ppo.engine_and_logger_problems(cfg)
    problems += resolve_legacy_micro_batch_sizes(cfg, world_size=ppo_world_size(cfg))
    problems += self_play_problems(cfg, min_n=min_n)
    if split_placement(cfg):
        problems.append(f"rollout.n_gpus_per_node={cfg.rollout.n_gpus_per_node}: the {trainer} trainer runs the "
                        "rollout inside the training processes (hybrid engine); set rollout.n_gpus_per_node=0")
    raise_if_problems(problems)
    warn_keys_without_effect(cfg, schema, trainer=trainer, hint=hints)
    arr = cfg.actor_rollout_ref
    validate_ppo_config(cfg, model_max_len=model_context_length(arr.model.path, arr.model.trust_remote_code))


def run_self_play(cfg, *, schema: type, trainer_cls: type[SelfPlayTrainer], min_n: int = 2,
                  hints: dict[str, str] | None = None):
    """Check, build, train, report (``main_spin`` / ``main_sppo``)."""
    check_self_play_config(cfg, schema=schema, trainer=trainer_cls.__name__, min_n=min_n, hints=hints)
    return train_and_report(build_self_play_trainer(cfg, trainer_cls), cfg)


"""The one training loop: ``fit()`` drives a rollout source, an update and a weight sync (``parts.py``) step by
step, and owns what every run shares: validation, checkpoints and resume, logging, early stopping, the summary.

    resume (checkpoint -> workers and every part's state; weights -> engine)
    [validation before training]
    for step in resumed + 1 .. total_steps:
        rollout = source.next_rollout;  batch, updated = update.train;  sync.after_update
        metrics (update, source, timing, throughput, memory) ──► validation every test_freq ──► tracking
        ──► checkpoint every save_freq (or a new best);  early stop after patience validations without a best
    summary table, best checkpoint, plots
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from hybridflow.errors import CheckpointError, WorkerDiedError
from hybridflow.trainer.checkpoints.best import BestCheckpoint, BestRecord, read_best_record, write_best_record
from hybridflow.trainer.checkpoints.manager import find_resume_checkpoint, load_checkpoint, save_checkpoint
from hybridflow.trainer.checkpoints.ownership import claim_run_folder
from hybridflow.trainer.loop.generation import Generation
from hybridflow.trainer.loop.parts import Parts, Run
from hybridflow.trainer.loop.validation import validate
from hybridflow.trainer.tracking.metrics import Timer, memory_metrics, throughput_metrics
from hybridflow.trainer.tracking.plots import plot_curves
from hybridflow.trainer.tracking.summary import summary_table

logger = logging.getLogger(__name__)


class Loop:
    """Drives ``parts`` through ``run.total_steps`` steps, validating and checkpointing."""

    def __init__(self, run: Run, parts: Parts, *, tracking, checkpoint_components: dict):
        self.run, self.parts, self.tracking = run, parts, tracking
        self.cfg, self.w, self.total_steps = run.cfg, run.workers, run.total_steps
        self.checkpoint_components = checkpoint_components
        self.generation = Generation(run)  # validation's: never a partial generate
        self.global_step = 0
        self.resumed_from = 0  # the step fit() resumed from
        self.best = BestCheckpoint.from_trainer_config(run.cfg.trainer)

    # ================================================================== the loop
    def fit(self) -> dict[str, float]:
        """Train to ``total_steps``; returns the last step's metrics (with the last validation)."""
        self.global_step = self.resumed_from = self.load_checkpoint()
        if self.global_step > 0:
            self.tracking.resume_at(self.global_step)
        if self.global_step >= self.total_steps > 0:
            print(f"hybridflow: the checkpoint is at step {self.global_step}, already at or past this run's "
                  f"{self.total_steps} steps (trainer.total_training_steps / total_epochs): nothing to train; "
                  "raise trainer.total_training_steps to train on", flush=True)  # fmt: skip
        last: dict[str, float] = {}
        if self.run.val_loader is not None and self.cfg.trainer.val_before_train and self.global_step == 0:
            last = self.validate()
            self.best.observe(last, step=0)  # the model before training is the score to beat
            self.tracking.log(last, step=0)
            if self.cfg.trainer.val_only:
                return last
        with self.tracking.progress(self.total_steps, initial_step=self.global_step):
            while self.global_step < self.total_steps:
                self.global_step += 1
                metrics = self.train_step_naming_failures()
                validation, keep_as_best = self._maybe_validate()
                metrics.update(validation)
                # logged before the checkpoint: a run killed once the checkpoint is published has this step's row
                self.tracking.log(metrics, step=self.global_step)
                self._maybe_save(keep_as_best=keep_as_best)
                last = metrics
                if self.best.should_stop():
                    logger.warning("early stop at step %d: %d validations without a new best (%s)",
                                   self.global_step, self.best.patience, self.best.describe())
                    break
        return last

    def train_step_naming_failures(self) -> dict[str, float]:
        """``train_step``; a worker process that dies is reported with the step and how to resume."""
        try:
            return self.train_step(step=self.global_step)
        except WorkerDiedError as err:
            raise WorkerDiedError(
                f"training step {self.global_step}: {err}; rerun the same command to resume from the last "
                f"checkpoint in {self.cfg.trainer.default_local_dir} (trainer.save_freq={self.cfg.trainer.save_freq})"
            ) from err

    def train_step(self, *, step: int) -> dict[str, float]:
        """One step: the source's rollout, the update, the weight sync; returns its metrics."""
        source, update, sync = self.parts.source, self.parts.update, self.parts.sync
        timer, metrics = Timer(), {}
        with timer("step"):
            rollout = source.next_rollout(step=step, timer=timer, metrics=metrics)
            batch, updated = update.train(rollout, step=step, timer=timer, metrics=metrics)
            sync.after_update(step=step, updated=updated, timer=timer)
        metrics.update(source.after_step(rollout))
        metrics.update(update.step_metrics(batch))
        metrics.update(timer.metrics())
        metrics.update(throughput_metrics(batch=batch, step_seconds=timer.timings["step"],
                                          num_workers=self.w.actor.world_size))
        metrics.update(memory_metrics())
        metrics["training/global_step"] = step
        metrics["training/epoch"] = self.run.train_loader.epoch
        return metrics

    # ================================================================== validation
    def validate(self) -> dict[str, float]:
        with self.parts.sync.engine_lock:  # not while the asynchronous source's weights change
            return validate(self.generation, step=self.global_step, tracking=self.tracking)

    def _maybe_validate(self) -> tuple[dict[str, float], bool]:
        """(validation metrics, whether this step is a new best to keep) on validation steps, else ({}, False)."""
        step, every = self.global_step, self.parts.validation_every
        due = every > 0 and (step % every == 0 or step >= self.total_steps)
        if self.run.val_loader is None or not due:
            return {}, False
        metrics = self.validate()
        return metrics, self.best.observe(metrics, step=step) and self.cfg.trainer.keep_best_checkpoint

    # ================================================================== checkpoints
    def _maybe_save(self, *, keep_as_best: bool) -> None:
        trainer, step = self.cfg.trainer, self.global_step
        last = step >= self.total_steps or self.best.should_stop()
        if keep_as_best or (trainer.save_freq > 0 and (step % trainer.save_freq == 0 or last)):
            path = self.save_checkpoint()
            if keep_as_best and path is not None:
                write_best_record(trainer.default_local_dir, BestRecord(
                    step=step, metric=self.best.metric_name, value=self.best.best_value, path=path))

    def checkpoint_state(self) -> dict:
        """The state beside the weights (``data.pt``): the step, the best-checkpoint record and every part's own."""
        state = {"global_step": self.global_step, "best": self.best.state_dict()}
        for part in (self.parts.source, self.parts.update, self.parts.sync):
            state.update(part.state_dict())
        return state

    def save_checkpoint(self) -> str | None:
        """Save this step; a failed save stops the run unless ``trainer.stop_on_checkpoint_error=false``."""
        state, trainer = self.checkpoint_state(), self.cfg.trainer
        # per role; other components (a self-play reference) follow the actor's limit
        limits = {"actor": trainer.max_actor_ckpt_to_keep, "critic": trainer.max_critic_ckpt_to_keep}
        try:
            return save_checkpoint(trainer.default_local_dir, self.global_step, self.checkpoint_components,
                                   extra=state, signature=self.signature(), max_to_keep={name: limits.get(name, trainer.max_actor_ckpt_to_keep)
                                                             for name in self.checkpoint_components},
                                   protect=self.protected_checkpoints())
        except CheckpointError as error:
            if trainer.stop_on_checkpoint_error:
                raise
            logger.warning("checkpoint of step %d not saved, training on as asked: %s", self.global_step, error)
            return None

    def protected_checkpoints(self) -> tuple[str, ...]:
        """The best checkpoint (``trainer.keep_best_checkpoint``), which rotation never deletes."""
        record = read_best_record(self.cfg.trainer.default_local_dir) if self.cfg.trainer.keep_best_checkpoint else None
        return (record.path,) if record is not None else ()

    def signature(self) -> dict:
        """The config values a checkpoint of this run cannot be resumed across (checkpoints/ownership.py)."""
        return {"algorithm.adv_estimator": self.cfg.algorithm.adv_estimator,
                "actor_rollout_ref.model.path": self.cfg.actor_rollout_ref.model.path}  # fmt: skip

    def load_checkpoint(self) -> int:
        """Resume per ``trainer.resume_mode``; returns the step to continue from (0 = fresh). A folder whose
        checkpoints this run did not make is refused first (``trainer.start_over`` deletes them instead)."""
        trainer = self.cfg.trainer
        claim_run_folder(trainer.default_local_dir, trainer.resume_mode, tuple(self.checkpoint_components),
                         self.signature(), start_over=trainer.start_over)  # fmt: skip
        path = find_resume_checkpoint(trainer.default_local_dir, trainer.resume_mode, trainer.resume_from_path,
                                      components=tuple(self.checkpoint_components))
        if path is None:
            return 0
        step, state = load_checkpoint(path, self.checkpoint_components)
        for part in (self.parts.source, self.parts.update, self.parts.sync):
            part.load_state_dict(state)
        self.best.load_state_dict(state.get("best", {}))
        self.parts.sync.push_current()
        print(f"hybridflow: resumed from {path} at step {step}", flush=True)
        return step

    def close(self) -> None:
        """Stop the rollout source and reward worker processes, flush trackers, release worker groups."""
        self.parts.source.close()
        self.w.reward.close()
        self.tracking.finish()
        groups = (self.w.actor, self.w.rollout, self.w.critic, self.w.implicit_prm)  # the rollout may have its own pool
        for group in {id(g): g for g in groups if hasattr(g, "shutdown")}.values():
            group.shutdown()


@dataclass
class PPORun:
    """What a finished run leaves: per-step metrics, the last step's metrics and the plot files."""

    history: list[dict[str, float]]
    last: dict[str, float]
    steps: int
    plots: list[str]
    resumed_from: int = 0  # the checkpoint's step this process started from (0: a fresh run)


def train_and_report(loop: Loop, cfg) -> PPORun:
    """Run a built loop to the end; print the summary and write the plots (every RL trainer's ending). The run
    folder and the plots folder are said at the start and again at the end, where the user looks for them."""
    run_dir = cfg.trainer.default_local_dir
    plots_dir = os.path.join(run_dir, "plots")
    every = cfg.trainer.save_freq
    saving = f"a checkpoint every {every} steps" if every > 0 else f"no checkpoints: trainer.save_freq={every}"
    print(f"hybridflow: run folder {run_dir} ({saving}); plots at the end in {plots_dir}", flush=True)
    try:
        last = loop.fit()
    finally:
        loop.close()
    history = loop.tracking.history
    print(summary_table(history))
    if cfg.trainer.keep_best_checkpoint or cfg.trainer.early_stop_patience > 0:
        print(loop.best.describe() + _best_folder(run_dir))
    plots = plot_curves(history, plots_dir)
    print(f"hybridflow: run folder {run_dir}; plots in {plots_dir}", flush=True)
    return PPORun(history=history, last=last, steps=loop.global_step, plots=plots, resumed_from=loop.resumed_from)


def _best_folder(root: str) -> str:
    record = read_best_record(root)
    return f" (kept at {record.path})" if record is not None else ""

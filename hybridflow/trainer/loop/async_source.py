"""Asynchronous PPO / GRPO: a rollouter fills a bounded queue while the trainer consumes it.

Dataflow (verl's fully_async_policy and one_step_off_policy recipes, on the same worker groups)::

    rollouter thread:  prompts ──► rollout.generate + reward (Generation.rollout_and_score, weight version v)
                       ──► queue  (waits while it is as far ahead as async_training.staleness_threshold allows)
    trainer (the loop): queue ──► the PPO update (old / ref log-probs, advantages, updates)
                       ──► every trigger_parameter_sync_step steps: weights → engine, version v + 1
                           (``weight_sync.EveryKStepsVersioned``, which wakes the rollouter)

How far ahead: with ``P = trigger_parameter_sync_step * require_batches`` batches per sync period and
``s = staleness_threshold``, the rollouter may have generated at most ``floor((syncs_done + 1 + s) * P)``
batches, so a batch is trained at most ``ceil(s)`` versions after the weights that generated it.
``s = 0`` is the synchronous loop (same seeds, same order: bit-for-bit main_ppo); ``s = 1`` with a sync
every step is one-step off-policy: step k + 1's rollout runs while step k trains.

Off-policy correction: with ``compute_prox_log_prob`` the trainer recomputes old log-probs with its
current weights (the proximal policy) and the existing ``algorithm.rollout_correction`` importance
weights correct behaviour → proximal; without it the behaviour log-probs are the old policy.

Checkpoints: a checkpoint holds the trained weights, the weight version, the staleness histogram, and
the batches generated but not trained yet (the queue, each with the weight version that generated it),
and the dataloader position after the last of them (each queued batch carries the loader state taken
with its prompts). A resume trains the stored batches first, as the uninterrupted run would have: they
were generated with weights older than the checkpoint's, which a resumed run no longer has, so
generating them again would differ. A generate in flight at the save started after the last sync (a
sync waits for the generate that holds the engine lock, and that one is queued before it lets go), so
it used the checkpoint's weights: it runs again after the resume from the same prompts with the same
seeds. So no prompt is lost or trained twice, and with a sync every step (``s = 0``, or one-step-off
``s = 1``) a resumed run equals an uninterrupted one bit for bit. With
``trigger_parameter_sync_step > 1`` a checkpoint taken inside a sync period resumes with the
checkpoint's weights in the engine, one sync early: not bitwise. With ``partial_rollout`` a sync does
not wait for the generate, whose sequences then mix versions: also not bitwise.

Partial rollouts (``partial_rollout``, native or vLLM engine; local backend, or Ray with split placement): a
weight sync does not wait for a running generate to finish. The generate pauses its in-flight sequences
between two decode steps (vLLM: aborts its requests, to resubmit them with their tokens so far), hands the engine over (``workers/rollout.py:EngineHandover``, kept by the rank
that holds the engine, so a Ray rollout actor runs the generate and the sync in two threads), and
continues each sequence from its exact next token with the new weights; every token keeps the behaviour
log-prob it was sampled with, so the proximal recompute and the rollout-correction weights see a per-token
mixture of behaviour policies.

The engine is shared by both threads (local backend) or by the controller's calls (Ray backend): the
driver's ``engine_lock`` keeps a weight sync out of a validation and, without partial rollouts, out of a
generate; the engine's own lock keeps any two calls on it apart.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from hybridflow.trainer.entry import partial_rollout_problems
from hybridflow.controller.dispatch import mean_metrics
from hybridflow.data.batch import Batch
from hybridflow.config.trainer import async_training_problems
from hybridflow.errors import HybridflowError
from hybridflow.trainer.loop.generation import Generation, PromptStream
from hybridflow.trainer.loop.parts import Rollout
from hybridflow.trainer.loop.weight_sync import EveryKStepsVersioned
from hybridflow.trainer.tracking.metrics import Timer


@dataclass
class RolloutItem:
    """One generated and scored prompt batch in the queue."""

    batch: Batch
    index: int
    """Position of its prompt batch in the run (0-based)."""
    version: int
    """Weight version (syncs done) that generated it."""
    loader_state: dict = field(default_factory=dict)
    """The dataloader's state right after its prompts were taken: where a resume after training it continues."""
    metrics: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)


@dataclass
class StalenessGate:
    """How many prompt batches the rollouter may have generated when ``syncs_done`` syncs happened."""

    staleness_threshold: float
    batches_per_sync: int

    def allowed(self, syncs_done: int) -> int:
        return math.floor((syncs_done + 1 + self.staleness_threshold) * self.batches_per_sync + 1e-9)

    @property
    def max_staleness(self) -> int:
        return math.ceil(self.staleness_threshold)


def check_async_config(cfg) -> None:
    """One clear error per unsupported or contradictory async_training setting: the section's checks
    (:func:`~hybridflow.config.trainer.async_training_problems`) and whether a partial rollout can act here (the
    engine registry's answer)."""
    problems = async_training_problems(cfg) + partial_rollout_problems(cfg)
    if problems:
        raise HybridflowError("; ".join(problems))


def async_training_steps(cfg, steps_per_epoch: int) -> int:
    """Trainer steps: rollout.total_rollout_steps // require_batches when set, else trainer.total_training_steps,
    else the epochs' (rollout.total_epochs, else trainer.total_epochs) prompt batches // require_batches. Checks the async settings first (before any model loads)."""
    check_async_config(cfg)
    require = cfg.async_training.require_batches
    if cfg.rollout.total_rollout_steps is not None:
        return cfg.rollout.total_rollout_steps // require
    epochs = cfg.rollout.total_epochs if cfg.rollout.total_epochs is not None else cfg.trainer.total_epochs
    steps = steps_per_epoch * epochs // require
    if cfg.trainer.total_training_steps is None and steps < 1:
        raise HybridflowError(
            f"{steps_per_epoch} batches per epoch x {epochs} epochs (rollout.total_epochs, else trainer.total_epochs) "
            f"is fewer than async_training.require_batches={require}: the trainer would run 0 steps; add data or "
            "epochs, or lower require_batches")
    return cfg.trainer.total_training_steps if cfg.trainer.total_training_steps is not None else steps


class AsyncSource:
    """Batches generated ahead by a rollouter thread, bounded by ``async_training.staleness_threshold`` weight
    versions of ``sync``; a step takes the ``require_batches`` oldest."""

    def __init__(self, generation: Generation, prompts: PromptStream, sync: EveryKStepsVersioned, *, cfg,
                 total_steps: int):
        check_async_config(cfg)
        self.generation, self.prompts, self.sync, self.cfg = generation, prompts, sync, cfg
        self.acfg, self.total_steps = cfg.async_training, total_steps
        self.gate = StalenessGate(self.acfg.staleness_threshold,
                                  self.acfg.trigger_parameter_sync_step * self.acfg.require_batches)
        self.partial = generation.partial
        self.changed = threading.Condition()
        self.queue: deque[RolloutItem] = deque()
        self.generated = 0
        self.stopping = False
        self.rollouter_error: BaseException | None = None
        self.rollouter: threading.Thread | None = None
        self.staleness_counts: dict[int, int] = {}
        """staleness -> trained batches, over the run (the histogram the metrics report)."""
        self.trained_loader_state: dict | None = None
        """The loader state after the last trained batch's prompts (what a checkpoint records)."""
        self.taken: list[RolloutItem] = []
        """The queue items of the step in progress (their versions and generation metrics)."""
        sync.on_new_version.append(self.wake)

    def wake(self) -> None:
        with self.changed:
            self.changed.notify_all()

    # ================================================================== the trainer side
    def next_rollout(self, *, step: int, timer: Timer, metrics: dict) -> Rollout:
        """The ``require_batches`` oldest queued batches as one; starts the rollouter on the first call."""
        require = self.acfg.require_batches
        if self.rollouter is None:
            self.start_rollouter(start=(step - 1) * require, total=self.total_steps * require)
        with timer("wait_for_rollout"):
            self.taken = [self.take() for _ in range(require)]
        self.trained_loader_state = self.taken[-1].loader_state
        return Rollout(Batch.concat([item.batch for item in self.taken]))

    def after_step(self, rollout: Rollout) -> dict[str, float]:
        """The generation metrics of the step's batches (averaged; their times added up) and the staleness ones."""
        items = self.taken
        metrics = {f"timing_s/{key}": sum(item.timings.get(key, 0.0) for item in items)
                   for key in dict.fromkeys(key for item in items for key in item.timings)}
        metrics.update(mean_metrics([item.metrics for item in items]))
        metrics.update(self.staleness_metrics(items))
        return metrics

    def take(self) -> RolloutItem:
        with self.changed:
            self.changed.wait_for(lambda: self.queue or self.rollouter_error is not None)
            if self.rollouter_error is not None:
                raise HybridflowError(f"the rollouter failed: {self.rollouter_error}") from self.rollouter_error
            item = self.queue.popleft()
            self.changed.notify_all()
            return item

    def staleness_metrics(self, items: list[RolloutItem]) -> dict[str, float]:
        """verl's ``fully_async/*`` counts plus the staleness histogram of the trained batches."""
        staleness = [max(0, self.version_at_training(item) - item.version) for item in items]
        for value in staleness:
            self.staleness_counts[value] = self.staleness_counts.get(value, 0) + 1
        with self.changed:
            queued = len(self.queue)
        rows = len(items[0].batch)
        metrics = {"fully_async/count/current_param_version": self.sync.version,
                   "fully_async/count/total_generated_samples": self.generated * self.generation.rollout_cfg.n
                   * self.cfg.data.train_batch_size,
                   "fully_async/count/stale_samples_processed": sum(
                       count for s, count in self.staleness_counts.items() if s > 0) * rows,
                   "fully_async/staleness/mean": sum(staleness) / len(staleness), "fully_async/queue_size": queued}
        metrics.update({f"fully_async/staleness/hist_{s}": count for s, count in sorted(self.staleness_counts.items())})
        if self.partial:  # responses whose tokens came from more than one weight version
            resumed = sum(int((item.batch["rollout_first_version"] != item.batch["rollout_last_version"]).sum())
                          for item in items)
            metrics["fully_async/partial/resumed_samples"] = resumed
        return metrics

    def version_at_training(self, item: RolloutItem) -> int:
        """Syncs done before the step that trained ``item`` (the weights the update started from)."""
        return item.index // self.gate.batches_per_sync

    # ================================================================== checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The batches generated but not trained yet (with their weight versions) and the staleness counts; the
        loader continues after the last of them (or the last trained batch)."""
        with self.changed:  # a generated batch is queued before the engine lock that a sync takes is released
            queued = list(self.queue)
        loader_state = queued[-1].loader_state if queued else self.trained_loader_state
        state = self.prompts.state_dict()
        if loader_state is not None:
            state["dataloader"] = loader_state
        state["async"] = {"staleness_counts": dict(self.staleness_counts), "queued": [vars(item) for item in queued]}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.prompts.load_state_dict(state)
        queue_state = state.get("async", {})
        self.staleness_counts = dict(queue_state.get("staleness_counts", {}))
        self.queue.extend(RolloutItem(**fields) for fields in queue_state.get("queued", []))

    # ================================================================== the rollouter side
    def start_rollouter(self, *, start: int, total: int) -> None:
        """Generate prompt batches ``start .. total - 1`` (``start`` > 0 after a resume), after those a
        checkpoint restored to the queue."""
        start += len(self.queue)
        self.generated = start
        self.rollouter = threading.Thread(target=self.rollouter_loop, args=(start, total),
                                          name="hybridflow-rollouter", daemon=True)
        self.rollouter.start()

    def rollouter_loop(self, start: int, total: int) -> None:
        try:
            for index in range(start, total):
                with self.changed:
                    self.changed.wait_for(lambda: self.stopping or index < self.gate.allowed(self.sync.version))
                    if self.stopping:
                        return
                prompts = next(self.prompts)
                # queued under the engine lock: a checkpoint (after a sync, which takes the lock) never
                # misses a batch generated with the weights before it
                with contextlib.nullcontext() if self.partial else self.sync.engine_lock:
                    item = self.generate_item(prompts, index=index,
                                              loader_state=self.prompts.state_dict()["dataloader"])
                    with self.changed:
                        self.queue.append(item)
                        self.generated += 1
                        self.changed.notify_all()
        except BaseException as err:  # handed to the trainer, which raises it with the step
            with self.changed:
                self.rollouter_error = err
                self.changed.notify_all()

    def generate_item(self, prompts: Batch, *, index: int, loader_state: dict) -> RolloutItem:
        """Generate and score one prompt batch with the weights loaded now (seeded as main_ppo's step)."""
        timer, metrics = Timer(), {}
        require = self.acfg.require_batches
        version = self.sync.version  # the caller holds the engine lock (without partial rollouts)
        batch = self.generation.rollout_and_score(prompts, step=index // require + 1, timer=timer, metrics=metrics,
                                                  attempt=index % require)
        if self.partial:  # the engine's version when its first token was sampled (a sync may have just landed)
            version = int(batch["rollout_first_version"].min())
        return RolloutItem(batch=batch, index=index, version=version, loader_state=loader_state, metrics=metrics,
                           timings=timer.timings)

    def close(self) -> None:
        with self.changed:
            self.stopping = True
            self.changed.notify_all()
        if self.rollouter is not None:
            self.rollouter.join()

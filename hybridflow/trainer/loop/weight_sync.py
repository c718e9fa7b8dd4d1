"""When the actor's weights go to the rollout engine, and how (``push_weights``).

``weight_sync_for`` picks the schedule from the config: after every update (the synchronous loops), or at the end
of every ``async_training.trigger_parameter_sync_step`` steps with a weight version (the asynchronous one). A new
schedule is a class here with ``after_update`` / ``push_current`` / ``state_dict`` and a line in ``weight_sync_for``.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from hybridflow.trainer.loop.parts import PPOWorkers
from hybridflow.trainer.tracking.metrics import Timer


def push_weights(workers: PPOWorkers, version: int | None = None) -> None:
    """Actor -> engine: in memory inside every rank of the hybrid engine (the worker's ``sync_rollout_weights``),
    or, with the rollout in a pool of its own (split placement), gathered on the training ranks and read by every
    rollout rank from training rank 0's object in Ray's store (the driver passes only its reference).
    ``version`` (the asynchronous run's weight version) tags the tokens the engine samples with them."""
    if workers.rollout is workers.actor:
        workers.actor.sync_rollout_weights(version)
    else:
        workers.rollout.load_weights(workers.actor.call_by_reference("rollout_weights"), version)


class AfterEveryUpdate:
    """The synchronous schedule: the engine gets the weights of every actor update (none in critic warm-up)."""

    def __init__(self, workers: PPOWorkers):
        self.workers = workers
        self.engine_lock = threading.Lock()

    def after_update(self, *, step: int, updated: bool, timer: Timer) -> None:
        if updated:
            with timer("sync_weights"):
                push_weights(self.workers)

    def push_current(self) -> None:
        push_weights(self.workers)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class EveryKStepsVersioned:
    """The asynchronous schedule: at the end of every ``every`` steps the engine gets the actor's weights (if it was
    updated in the period; with ``partial`` always, so the engine learns the new version) and the version counts up.

    The load and the count happen under ``engine_lock``, so a generate holding it sees matching weights and
    version; ``on_new_version`` callbacks (the asynchronous source's gate) run after each count."""

    def __init__(self, workers: PPOWorkers, *, every: int, partial: bool):
        self.workers, self.every, self.partial = workers, every, partial
        self.engine_lock = threading.Lock()
        self.version = 0
        """Syncs done: the version of the weights in the engine."""
        self.updated_in_period = False
        self.on_new_version: list[Callable[[], None]] = []

    def after_update(self, *, step: int, updated: bool, timer: Timer) -> None:
        with timer("sync_weights"):
            self.updated_in_period |= updated
            if step % self.every != 0:
                return
            with self.engine_lock:  # a partial generate does not hold it: the engine's own handover pauses it
                if self.updated_in_period or self.partial:
                    push_weights(self.workers, version=self.version + 1)
                    self.updated_in_period = False
                self.version += 1
                for callback in self.on_new_version:
                    callback()

    def push_current(self) -> None:
        """Tagged with the checkpoint's version."""
        push_weights(self.workers, version=self.version)

    def state_dict(self) -> dict[str, Any]:
        return {"weight_version": self.version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # checkpoints of the async trainer before the loop was built from parts kept it as async.syncs_done
        self.version = state.get("weight_version", state.get("async", {}).get("syncs_done", 0))


def weight_sync_for(cfg, workers: PPOWorkers, *, asynchronous: bool, partial: bool = False):
    """The schedule a run uses: every ``async_training.trigger_parameter_sync_step`` steps with versions when the
    rollout runs ahead of the trainer, else after every update."""
    if asynchronous:
        return EveryKStepsVersioned(workers, every=cfg.async_training.trigger_parameter_sync_step, partial=partial)
    return AfterEveryUpdate(workers)

"""What the loop is made of: the run every part reads, and the three parts an entry point chooses.

One step of :class:`hybridflow.trainer.loop.fit.Loop`::

    rollout = source.next_rollout(step)            prompts -> responses, scores      (sync, DAPO refill, async)
    batch, updated = update.train(rollout, step)   log-probs, advantages, updates    (PPO, or SPIN / SPPO)
    sync.after_update(step, updated)               actor weights -> rollout engine   (every update, or every k)
    metrics: update.step_metrics(batch), source.after_step(rollout)

Each part keeps its state for checkpoints in ``state_dict()`` / ``load_state_dict()``: the keys it returns go to
the step's ``data.pt`` beside the loop's own (``global_step``, ``best``), so a part added later brings its state
with it and the loop does not change.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from hybridflow.data.batch import Batch
from hybridflow.trainer.tracking.metrics import Timer
from hybridflow.workers.actor import ActorWorker
from hybridflow.workers.critic import CriticWorker
from hybridflow.workers.implicit_prm import ImplicitPRMWorker
from hybridflow.workers.teacher import TeacherWorker  # noqa: F401  (annotation)
from hybridflow.workers.reference import ReferenceWorker
from hybridflow.workers.reward import RewardWorker
from hybridflow.workers.rollout import RolloutWorker


@dataclass
class PPOWorkers:
    """The roles one step drives: worker groups (``hybridflow.controller``) or plain workers,
    anything with the methods of the ``hybridflow.workers`` classes named in the annotations.
    With the hybrid engine, ``actor``, ``rollout`` and ``reference`` are the same group."""

    actor: "ActorWorker"
    rollout: "RolloutWorker"
    reward: RewardWorker
    reference: "ReferenceWorker | None" = None
    critic: "CriticWorker | None" = None
    implicit_prm: "ImplicitPRMWorker | None" = None
    """PRIME's implicit process reward model (``adv_estimator=prime``)."""
    teacher: "TeacherWorker | None" = None
    """On-policy distillation's teachers (``distillation.enabled``; issue 60)."""


@dataclass
class Run:
    """What every part of a run reads: the config, the workers, the data and the run's constants."""

    cfg: Any
    workers: PPOWorkers
    train_loader: Any
    val_loader: Any
    tokenizer: Any
    device: torch.device
    total_steps: int
    stop_token_ids: list[int]


@dataclass
class Rollout:
    """One step's generated and scored samples: ``batch`` ``[B * n, ...]``; ``prompts`` ``[B, ...]`` where the
    source kept them (a synchronous source; SPIN's dataset-answer pairs are built from them)."""

    batch: Batch
    prompts: Batch | None = None


class RolloutSource(Protocol):
    """Where a step's samples come from."""

    def next_rollout(self, *, step: int, timer: Timer, metrics: dict) -> Rollout: ...

    def after_step(self, rollout: Rollout) -> dict[str, float]:
        """Metrics of the source once the step's weight sync is done."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class WeightSync(Protocol):
    """When the actor's weights go to the rollout engine."""

    engine_lock: threading.Lock
    """Held by a weight sync and a validation (and an asynchronous generate): one at a time on the engine."""

    def after_update(self, *, step: int, updated: bool, timer: Timer) -> None: ...

    def push_current(self) -> None:
        """The actor's weights into the engine now (after a resume)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Update(Protocol):
    """How a step's samples change the weights."""

    def train(self, rollout: Rollout, *, step: int, timer: Timer, metrics: dict) -> tuple[Batch, bool]:
        """Returns the batch the step's metrics describe and whether the actor was updated."""

    def step_metrics(self, batch: Batch) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class Parts:
    """An entry point's choice: the three parts, and how many steps apart validation runs."""

    source: RolloutSource
    sync: WeightSync
    update: Update
    validation_every: int

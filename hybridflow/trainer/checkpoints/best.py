"""Best-checkpoint selection and early stopping on the validation score.

Small-model RL on verifiable tasks often peaks and then declines on held-out data (docs/recipes.md
shows such runs). A user wants the peak, not the last step. After every validation the trainer
hands the metrics to :meth:`BestCheckpoint.observe`:

- the score is ``trainer.best_metric`` (higher is better), or, when that is null, the mean of the
  run's ``val-core/`` metrics (one reward mean per data source);
- a new best (strictly higher) is saved as a checkpoint when ``trainer.keep_best_checkpoint`` is set,
  that step is never rotated away by ``max_actor_ckpt_to_keep``, and ``best_checkpoint.json`` in the
  checkpoint root names it (step, metric, value, folder);
- the validation before training (``trainer.val_before_train``) is the score to beat; it is never
  saved (it is the base model);
- ``trainer.early_stop_patience`` = P > 0 stops the run after P validations in a row without a new best.

The state (best value and step, validations since) goes into every checkpoint, so a resumed run
selects and stops exactly as the uninterrupted one would.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from hybridflow.trainer.checkpoints.manager import write_text_atomic
from hybridflow.trainer.tracking.summary import VALIDATION_PREFIX

RECORD_FILE = "best_checkpoint.json"


def validation_score(metrics: Mapping[str, float], metric: str | None) -> float | None:
    """The score a validation's ``metrics`` give: ``metric``'s value, or the mean of the ``val-core/`` ones.

    None when the validation has no such metric (e.g. no validation ran at this step).
    """
    if metric is not None:
        value = metrics.get(metric)
        return None if value is None else float(value)
    values = [float(v) for k, v in metrics.items() if k.startswith(VALIDATION_PREFIX)]
    return sum(values) / len(values) if values else None


@dataclass
class BestCheckpoint:
    """Tracks the best validation score of a run and when to stop early."""

    metric: str | None = None
    """``trainer.best_metric`` (null: mean of ``val-core/``)."""
    patience: int = 0
    """``trainer.early_stop_patience`` (0: never stop early)."""
    best_value: float = -math.inf
    best_step: int | None = None
    validations_since_best: int = 0

    @classmethod
    def from_trainer_config(cls, trainer_cfg: Any) -> "BestCheckpoint":
        return cls(metric=trainer_cfg.best_metric, patience=trainer_cfg.early_stop_patience)

    @property
    def metric_name(self) -> str:
        return self.metric or "mean of val-core/*"

    def observe(self, metrics: Mapping[str, float], *, step: int) -> bool:
        """Record one validation; True when it is a new best (ties keep the earlier step)."""
        score = validation_score(metrics, self.metric)
        if score is None or not math.isfinite(score):
            return False
        if score > self.best_value:
            self.best_value, self.best_step, self.validations_since_best = score, step, 0
            return True
        self.validations_since_best += 1
        return False

    def should_stop(self) -> bool:
        """True once ``patience`` validations in a row brought no new best."""
        return self.patience > 0 and self.best_step is not None and self.validations_since_best >= self.patience

    def state_dict(self) -> dict[str, Any]:
        return {"best_value": self.best_value, "best_step": self.best_step,
                "validations_since_best": self.validations_since_best}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.best_value = float(state.get("best_value", -math.inf))
        self.best_step = state.get("best_step")
        self.validations_since_best = int(state.get("validations_since_best", 0))

    def describe(self) -> str:
        """One line for the end of the run."""
        if self.best_step is None:
            return "best validation: none (no validation score was logged)"
        where = " (the model before training: no step beat it)" if self.best_step == 0 else ""
        return f"best validation: step {self.best_step}{where}, {self.metric_name} = {self.best_value:.4g}"


@dataclass(frozen=True)
class BestRecord:
    """What ``best_checkpoint.json`` holds."""

    step: int
    metric: str
    value: float
    path: str


def write_best_record(root: str, record: BestRecord) -> str:
    """Write ``root/best_checkpoint.json`` atomically; returns its path."""
    path = os.path.join(root, RECORD_FILE)
    write_text_atomic(path, json.dumps(asdict(record), indent=2) + "\n")
    return path


def read_best_record(root: str) -> BestRecord | None:
    """The record in ``root``, or None when no best checkpoint was kept there."""
    path = os.path.join(root, RECORD_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return BestRecord(**json.load(handle))

"""The preference update of the self-play methods (SPIN, SPPO): the loop's update part for both.

Each step it refreshes the reference at iteration boundaries, asks the method for its training rows (SPIN's
pairs, ``spin.py``; SPPO's win rates, ``sppo.py``), takes the reference's sequence log-probs and runs the actor's
preference update; the weight sync after it is the loop's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from hybridflow.algos import masked_sum
from hybridflow.data.batch import Batch
from hybridflow.trainer.loop.parts import Rollout, Run
from hybridflow.trainer.tracking.metrics import Timer, rollout_metrics

REFERENCE_COMPONENT = "ref"
"""Checkpoint component of a refreshed reference: ``global_step_N/ref`` beside ``global_step_N/actor``."""


def reference_refresh_due(step: int, ref_update_freq: int) -> bool:
    """verl's recipes: the reference becomes the actor at the start of steps divisible by ref_update_freq."""
    return ref_update_freq > 0 and step % ref_update_freq == 0


@dataclass
class PreferenceRows:
    """What a self-play method trains on in one step: rows for the actor's ``update_preference``."""

    batch: Batch
    objective: str
    params: dict[str, Any]
    rows_per_prompt: int


class SelfPlayMethod(Protocol):
    """SPIN or SPPO: a step's rollout as preference rows (None: nothing to train on this step)."""

    def rows(self, rollout: Rollout, *, timer: Timer, metrics: dict) -> PreferenceRows | None: ...


class PreferenceUpdate:
    """The reference refresh, the reference's sequence log-probs and the preference update of ``method``."""

    def __init__(self, run: Run, method: SelfPlayMethod):
        self.run, self.method, self.w = run, method, run.workers

    def train(self, rollout: Rollout, *, step: int, timer: Timer, metrics: dict) -> tuple[Batch, bool]:
        """Returns the rollout's batch (what the step's metrics describe) and whether the actor was updated. The
        reference is refreshed here, not before the rollout: the actor's weights are the same at both points."""
        if reference_refresh_due(step, self.run.cfg.trainer.ref_update_freq):
            with timer("update_ref"):
                self.w.reference.refresh_reference()
        rows = self.method.rows(rollout, timer=timer, metrics=metrics)
        if rows is None:
            return rollout.batch, False
        temperature = self.run.cfg.actor_rollout_ref.rollout.temperature
        with timer("ref"):
            ref = self.w.reference.compute_ref_log_prob(rows.batch, temperature=temperature)
            rows.batch["ref_seq_log_prob"] = masked_sum(values=ref, mask=rows.batch["response_mask"], dim=-1)
        with timer("update_actor"):
            metrics.update(self.w.actor.update_preference(rows.batch, objective=rows.objective, params=rows.params,
                                                          rows_per_prompt=rows.rows_per_prompt,
                                                          temperature=temperature, step=step))
        return rollout.batch, True

    def step_metrics(self, batch: Batch) -> dict[str, float]:
        return rollout_metrics(batch, max_response_length=self.run.cfg.data.max_response_length)

    def state_dict(self) -> dict[str, Any]:
        return {}  # the refreshed reference is a checkpoint component of its own (REFERENCE_COMPONENT)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

"""SPIN / online DPO (verl's ``recipe/spin``): the policy plays against its previous iterate.

Dataflow of one step (Chen et al. 2024, arXiv 2401.01335; online DPO as in verl's recipe)::

    [step % trainer.ref_update_freq == 0]  reference <- actor weights      (a new SPIN iteration)
    prompts ──► rollout.generate (rollout.n >= 2 responses per prompt)
            ──► reward.compute_scores (rule / custom function / reward model)
            ──► best_worst_pairs: chosen = best, rejected = worst response of each prompt
            ──► reference.compute_ref_log_prob on the pairs ──► log pi_ref(y | x) summed per response
            ──► actor.update_preference("dpo" | "ipo", beta = actor.dpo_beta)
                    -log sigmoid(beta [(log pi/pi_ref)(y_w) - (log pi/pi_ref)(y_l)])   (DPO eq. 7)
            ──► rollout.load_weights(actor weights)
            ──► metrics ──► tracking (every trainer.log_freq);  validation every test_freq;  checkpoint

Fit, validation (``val-core/...``), checkpoints and resume are the PPO trainer's
(``trainer/ppo.py``); a refreshed reference is checkpointed as ``global_step_N/ref``.

Deviations, on purpose:
- From SPIN's paper: the chosen response is the best-scored sample, not the dataset's
  reference answer (the paper's Sec. 7 "dynamically changing target distribution", which is
  also what verl's recipe runs); a dataset-answer preference source is not implemented.
- From verl's recipe: with rollout.n > 2 the pair is best vs worst (verl pairs exactly 2);
  prompts whose responses all score the same give no pair (verl keeps them, taking the
  first response as chosen), so a step can train on fewer pairs than prompts, and on none
  (then the actor is not updated). The pair count is cut to a multiple of the data-parallel
  size. ``ppo_mini_batch_size`` (pairs per optimizer step) and ``ppo_epochs`` take effect
  (verl's recipe makes one step over the whole batch: the same with the defaults when the
  mini-batch is at least the batch).
"""

from __future__ import annotations

from typing import Iterator

from hybridflow.algos.self_play import best_worst_pairs
from hybridflow.data.batch import Batch
from hybridflow.trainer.metrics import Timer, rollout_metrics
from hybridflow.trainer.self_play import SelfPlayTrainer

LOSS_TYPES = {"sigmoid": "dpo", "ipo": "ipo"}
"""``algorithm.dpo_loss_type`` -> the actor's preference objective."""


class SPINTrainer(SelfPlayTrainer):
    """Online DPO on best-vs-worst pairs of the policy's own samples, against a periodically refreshed reference."""

    def train_step(self, batches: Iterator[Batch], *, step: int) -> dict[str, float]:
        timer, metrics = Timer(), {}
        with timer("step"):
            self.refresh_reference_if_due(step=step, timer=timer)
            batch = self.rollout_and_score(next(batches), step=step, timer=timer, metrics=metrics)
            with timer("pairs"):
                pairs = self.preference_pairs(batch)
            metrics["train/num_pairs"] = len(pairs) // 2
            if len(pairs):
                metrics.update(self.update_actor(pairs, objective=LOSS_TYPES[self.cfg.algorithm.dpo_loss_type],
                                                 params=self.loss_params(), rows_per_prompt=2, step=step, timer=timer))
        metrics.update(rollout_metrics(batch, max_response_length=self.cfg.data.max_response_length))
        return self.step_metrics(metrics, batch=batch, timer=timer, step=step)

    def preference_pairs(self, batch: Batch) -> Batch:
        """Rows ``[chosen_0, rejected_0, chosen_1, ...]``: whole pairs on every data-parallel worker."""
        chosen, rejected = best_worst_pairs(scores=batch["seq_score"], group_size=self.rollout_cfg.n)
        world = getattr(self.w.actor, "world_size", 1)
        keep = len(chosen) - len(chosen) % world
        rows = [row for pair in zip(chosen[:keep].tolist(), rejected[:keep].tolist()) for row in pair]
        return batch.index_select(rows)

    def loss_params(self) -> dict[str, float]:
        beta = self.cfg.actor_rollout_ref.actor.dpo_beta
        if self.cfg.algorithm.dpo_loss_type == "ipo":
            return {"beta": beta}
        return {"beta": beta, "label_smoothing": self.cfg.algorithm.dpo_label_smoothing}

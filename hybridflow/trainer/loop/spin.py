"""SPIN / online DPO (verl's ``recipe/spin``): the policy plays against its previous iterate.

Dataflow of one step (Chen et al. 2024, arXiv 2401.01335; online DPO as in verl's recipe)::

    [step % trainer.ref_update_freq == 0]  reference <- actor weights      (a new SPIN iteration)
    prompts ──► rollout.generate (rollout.n >= 2 responses per prompt)
            ──► reward.compute_scores (rule / custom function / reward model)
            ──► pairs (algorithm.preference_source): best vs worst sample, or dataset answer vs sample
            ──► reference.compute_ref_log_prob on the pairs ──► log pi_ref(y | x) summed per response
            ──► actor.update_preference("dpo" | "ipo", beta = actor.dpo_beta)
                    -log sigmoid(beta [(log pi/pi_ref)(y_w) - (log pi/pi_ref)(y_l)])   (DPO eq. 7)
            ──► weight sync (actor -> engine, after every update)
            ──► metrics ──► tracking (every trainer.log_freq);  validation every test_freq;  checkpoint

:class:`SPIN` is the method the preference update (``loop/preference_update.py``) asks for its rows; fit, validation
(``val-core/...``), checkpoints and resume are the loop's (``loop/fit.py``); a refreshed reference is
checkpointed as ``global_step_N/ref``.

Preference sources (``algorithm.preference_source``):
- ``reward`` (default, verl's recipe): chosen = the best-scored, rejected = the worst-scored
  sample of each prompt (the paper's Sec. 7 "dynamically changing target distribution").
- ``ground_truth`` (SPIN proper): chosen = the dataset's answer (``reward_model.ground_truth``
  tokenized, + EOS), rejected = each of the policy's ``rollout.n`` samples (n >= 1).

Deviations, on purpose:
- From SPIN's paper (``ground_truth``): the "human" response is the row's ground truth, which
  for verifiable tasks is often only the final answer, not a worked solution.
- From verl's recipe: with rollout.n > 2 the pair is best vs worst (verl pairs exactly 2);
  prompts whose responses all score the same give no pair (verl keeps them, taking the
  first response as chosen), so a step can train on fewer pairs than prompts, and on none
  (then the actor is not updated). The pair count is cut to a multiple of the data-parallel
  size. ``ppo_mini_batch_size`` (pairs per optimizer step) and ``ppo_epochs`` take effect
  (verl's recipe makes one step over the whole batch: the same with the defaults when the
  mini-batch is at least the batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hybridflow.algos.self_play import best_worst_pairs
from hybridflow.data.batch import Batch
from hybridflow.rollout import Completion
from hybridflow.trainer.loop.parts import Rollout, Run
from hybridflow.trainer.tracking.metrics import Timer
from hybridflow.trainer.loop.preference_update import PreferenceRows
from hybridflow.workers.rollout import RolloutWorker

LOSS_TYPES = {"sigmoid": "dpo", "ipo": "ipo"}
"""``algorithm.dpo_loss_type`` -> the actor's preference objective."""


def reward_ranked_pairs(run: Run, batch: Batch, prompts: Batch) -> Batch:
    """Online DPO: the best-scored vs the worst-scored sample of each prompt (ties: no pair)."""
    chosen, rejected = best_worst_pairs(scores=batch["seq_score"], group_size=run.cfg.actor_rollout_ref.rollout.n)
    rows = [row for pair in zip(chosen.tolist(), rejected.tolist()) for row in pair]
    return batch.index_select(rows)


def ground_truth_pairs(run: Run, batch: Batch, prompts: Batch) -> Batch:
    """SPIN proper (Chen et al. 2024, Sec. 4): the dataset's answer (``reward_model.ground_truth`` + EOS) is
    chosen against each of the policy's own samples; rows ``[answer, sample_0, answer, sample_1, ...]``."""
    tokenizer, n = run.tokenizer, run.cfg.actor_rollout_ref.rollout.n
    max_len = run.cfg.data.max_response_length
    completions = []
    for row in range(len(batch)):
        answer = tokenizer.encode(str(batch["ground_truth"][row]), add_special_tokens=False)
        answer = (answer + [tokenizer.eos_token_id])[:max_len]
        sample = batch["responses"][row][batch["response_mask"][row].bool()].tolist()
        completions += [Completion(token_ids=answer, logprobs=None, finish_reason="stop", prompt_index=row // n),
                        Completion(token_ids=sample, logprobs=None, finish_reason=batch["finish_reason"][row],
                                   prompt_index=row // n)]
    assembler = RolloutWorker(engine=None, pad_token_id=tokenizer.pad_token_id)
    return assembler.assemble(prompts, completions, n=2 * n).to(batch["responses"].device)


@dataclass(frozen=True)
class PairSource:
    """How a step's samples become (chosen, rejected) rows, and how many pairs a prompt gives at rollout.n."""

    pairs: Callable[[Run, Batch, Batch], Batch]
    pairs_per_prompt: Callable[[int], int]


PAIR_SOURCES = {"reward": PairSource(reward_ranked_pairs, pairs_per_prompt=lambda n: 1),
                "ground_truth": PairSource(ground_truth_pairs, pairs_per_prompt=lambda n: n)}
"""``algorithm.preference_source`` -> its pair source."""


class SPIN:
    """Online DPO on best-vs-worst pairs of the policy's own samples (or the dataset's answer against each sample),
    against a periodically refreshed reference."""

    def __init__(self, run: Run):
        self.run, self.cfg = run, run.cfg

    def rows(self, rollout: Rollout, *, timer: Timer, metrics: dict) -> PreferenceRows | None:
        """``[chosen_0, rejected_0, chosen_1, ...]``; None when no prompt gave a pair."""
        source = PAIR_SOURCES[self.cfg.algorithm.preference_source]
        with timer("pairs"):
            pairs = self.whole_pairs(source.pairs(self.run, rollout.batch, rollout.prompts))
        metrics["train/num_pairs"] = len(pairs) // 2
        if not len(pairs):
            return None
        return PreferenceRows(pairs, objective=LOSS_TYPES[self.cfg.algorithm.dpo_loss_type], params=self.loss_params(),
                              rows_per_prompt=2 * source.pairs_per_prompt(self.cfg.actor_rollout_ref.rollout.n))

    def whole_pairs(self, pairs: Batch) -> Batch:
        """Rows ``[chosen_0, rejected_0, chosen_1, ...]`` cut to the same number of pairs on every worker."""
        world = getattr(self.run.workers.actor, "world_size", 1)
        count = len(pairs) // 2
        return pairs.index_select(list(range(2 * (count - count % world))))

    def loss_params(self) -> dict[str, float]:
        beta = self.cfg.actor_rollout_ref.actor.dpo_beta
        if self.cfg.algorithm.dpo_loss_type == "ipo":
            return {"beta": beta}
        return {"beta": beta, "label_smoothing": self.cfg.algorithm.dpo_label_smoothing}

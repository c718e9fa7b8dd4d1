"""SPPO (verl's ``recipe/sppo``): self-play preference optimisation towards the Nash equilibrium.

Dataflow of one step (Wu et al. 2024, arXiv 2405.00675, Algorithm 1 with K = rollout.n)::

    [step % trainer.ref_update_freq == 0]  reference pi_t <- actor weights   (a new SPPO iteration)
    prompts ──► rollout.generate (rollout.n >= 2 responses per prompt, from pi_t)
            ──► reward.compute_scores (rule / custom function / reward model)
            ──► group_win_rates: P(y_i > pi_t | x) = 1/K sum_j [1(s_i > s_j) + 1/2 1(s_i = s_j)]
            ──► reference.compute_ref_log_prob ──► log pi_t(y | x) summed per response
            ──► actor.update_preference("sppo", eta = actor.sppo_eta or algorithm.sppo_eta)
                    (log pi(y|x) - log pi_t(y|x) - eta (P(y > pi_t | x) - 1/2))^2
            ──► weight sync (actor -> engine, after every update)
            ──► metrics ──► tracking (every trainer.log_freq);  validation every test_freq;  checkpoint

:class:`SPPO` is the method the preference update (``loop/preference_update.py``) asks for its rows; fit, validation
(``val-core/...``), checkpoints and resume are the loop's (``loop/fit.py``); a refreshed reference is
checkpointed as ``global_step_N/ref``.

Deviations, on purpose:
- From the paper: the preference oracle is the comparison of scalar scores (a rule or a
  reward model's score), P(y > y') = 1 / 0 / 1/2 for a higher / lower / equal score, where
  the paper queries PairRM for P(y > y'); one SPPO iteration is ``ref_update_freq`` steps
  on fresh samples rather than epochs over a fixed generated set.
- From verl's recipe: verl regresses on eta * (r - softmean_eta(r)) of the raw reward over the
  whole batch (no win rates); here the target is the paper's eta (P - 1/2) within each
  prompt's group. verl's two ``sppo_eta`` keys (actor's for the loss, algorithm's for the
  soft-mean) are one eta here. The log-ratio is taken against the reference refreshed every
  ``ref_update_freq`` steps (verl: against the step's old log-probs, i.e. refresh every step,
  which is ``ref_update_freq=1``, the default).
"""

from __future__ import annotations

from hybridflow.algos.self_play import group_win_rates
from hybridflow.errors import ConfigError
from hybridflow.trainer.loop.parts import Rollout, Run
from hybridflow.trainer.tracking.metrics import Timer
from hybridflow.trainer.loop.preference_update import PreferenceRows


def sppo_eta(cfg) -> float:
    """verl declares eta under the actor and under the algorithm; either one sets it, both must agree."""
    actor_eta, algorithm_eta = cfg.actor_rollout_ref.actor.sppo_eta, cfg.algorithm.sppo_eta
    if algorithm_eta is not None and actor_eta not in (algorithm_eta, 1.0):
        raise ConfigError(f"actor_rollout_ref.actor.sppo_eta={actor_eta} and algorithm.sppo_eta={algorithm_eta} "
                          "disagree: set only one of them")
    return actor_eta if algorithm_eta is None else algorithm_eta


class SPPO:
    """SPPO's squared loss on the policy's own samples, with win rates estimated within each prompt's group."""

    def __init__(self, run: Run):
        self.run, self.cfg = run, run.cfg

    def rows(self, rollout: Rollout, *, timer: Timer, metrics: dict) -> PreferenceRows:
        """Every sample, with ``win_prob`` [B * n] against its group."""
        batch, n = rollout.batch, self.cfg.actor_rollout_ref.rollout.n
        batch["win_prob"] = group_win_rates(scores=batch["seq_score"], group_size=n)
        return PreferenceRows(batch, objective="sppo", params={"eta": sppo_eta(self.cfg)}, rows_per_prompt=n)

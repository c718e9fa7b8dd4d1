"""``python -m hybridflow.trainer.main_spin key=value ...``: SPIN / online DPO (verl's ``recipe.spin.main_spin``).

Takes the keys of verl's ``recipe/spin/run_spin.sh`` (``hybridflow config dump spin`` lists all).
"""

from __future__ import annotations

import sys

from hybridflow.config.loader import run_from_config_args
from hybridflow.config.spin import SPINConfig
from hybridflow.errors import ConfigError, run_entry_point
from hybridflow.trainer.roles.self_play import run_self_play
from hybridflow.trainer.loop.spin import LOSS_TYPES, PAIR_SOURCES, SPIN

HINTS = {"algorithm.kl_ctrl.kl_coef": "the DPO beta is actor_rollout_ref.actor.dpo_beta, as in verl's recipe/spin"}


def run_spin(cfg: SPINConfig):
    """Check, build, train; print the summary and write the plots."""
    algo = cfg.algorithm
    for key, value, names in (("algorithm.dpo_loss_type", algo.dpo_loss_type, LOSS_TYPES),
                              ("algorithm.preference_source", algo.preference_source, PAIR_SOURCES)):
        if value not in names:
            raise ConfigError(f"{key}={value!r} is not one of {', '.join(names)}")
    beta = cfg.actor_rollout_ref.actor.dpo_beta
    if not beta > 0:
        raise ConfigError(f"actor_rollout_ref.actor.dpo_beta={beta} must be > 0: beta scales the implicit "
                          "reward (a negative one prefers the rejected answers, 0 learns nothing); typical values "
                          "are 0.01-0.5")
    if cfg.actor_rollout_ref.actor.use_dynamic_bsz:
        raise ConfigError("actor_rollout_ref.actor.use_dynamic_bsz=True: SPIN splits micro-batches by whole pairs; "
                          "set ppo_micro_batch_size_per_gpu (pairs per micro-batch) instead")
    # a dataset answer pairs with every sample; ranking samples needs two of them
    min_n = 1 if algo.preference_source == "ground_truth" else 2
    return run_self_play(cfg, schema=SPINConfig, method=SPIN, trainer="SPIN", min_n=min_n, hints=HINTS)


USAGE_SUMMARY = "SPIN / online DPO self-play with verl's recipe.spin keys (also: hybridflow spin)."


def run_from_args(args: list[str], *, prog: str = "python -m hybridflow.trainer.main_spin") -> int:
    """``[--config-path D --config-name N] key=value ...`` -> a run (shared by ``hybridflow spin``)."""
    return run_from_config_args(args, schema=SPINConfig, run=run_spin, trainer="spin", prog=prog,
                                summary=USAGE_SUMMARY)


def main(argv: list[str] | None = None) -> int:
    return run_entry_point(run_from_args, list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())

"""``python -m hybridflow.trainer.main_prime key=value ...``: PRIME as verl-recipe's ``recipe.prime.main_prime`` runs it.

main_ppo started from the settings of the recipe's ``prime_trainer.yaml`` (the ``prime`` reward manager, n = 4,
entropy_coeff 0.001, kl_coef 0, no balance_batch, no validation before training, project ``prime``). The recipe's
keys mean what they mean there: ``reward_model.enable=True`` is the implicit PRM (not a scoring reward model: the
rule reward scores), and ``algorithm.adv_estimator=rloo`` is PRIME's RLOO per reward source, hybridflow's
``adv_estimator=prime``. A ``--config-path/--config-name`` YAML and the command line go on top.
"""

from __future__ import annotations

import sys

from hybridflow.errors import ConfigError, run_entry_point
from hybridflow.trainer.main_ppo import run_from_args

PRIME_DEFAULTS = ("reward_model.enable=True", "reward_model.reward_manager=prime", "algorithm.adv_estimator=rloo",
                  "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.entropy_coeff=0.001",
                  "algorithm.kl_ctrl.kl_coef=0.0", "data.truncation=right", "trainer.project_name=prime",
                  "trainer.experiment_name=examples", "trainer.val_before_train=False", "trainer.balance_batch=False")
"""What verl-recipe's prime/config/prime_trainer.yaml sets on top of verl's ppo_trainer.yaml (and hybridflow runs)."""
PRIME_ESTIMATORS = ("rloo", "prime")
USAGE_SUMMARY = "PRIME (verl-recipe's recipe.prime.main_prime): main_ppo with an implicit PRM trained online."


def recipe_meaning(cfg):
    """The recipe's keys read as the recipe reads them: the PRM switch and its RLOO become ``adv_estimator=prime``."""
    problems = []
    if not cfg.reward_model.enable:
        problems.append("main_prime trains the implicit PRM that reward_model.enable=True turns on; keep it on, or run "
                        "plain RLOO with python -m hybridflow.trainer.main_ppo algorithm.adv_estimator=rloo")
    if cfg.algorithm.adv_estimator not in PRIME_ESTIMATORS:
        problems.append(f"main_prime: algorithm.adv_estimator={cfg.algorithm.adv_estimator!r}; PRIME's advantages are "
                        "its RLOO per reward source: use rloo (the recipe's key) or prime")
    if problems:
        raise ConfigError("\n".join(problems))
    cfg.algorithm.adv_estimator = "prime"
    cfg.reward_model.enable = False  # the PRM is built for the estimator; no scoring reward model
    return cfg


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    return run_entry_point(lambda a: run_from_args(a, prog="python -m hybridflow.trainer.main_prime",
                                                   summary=USAGE_SUMMARY, defaults=PRIME_DEFAULTS,
                                                   adapt=recipe_meaning), args)


if __name__ == "__main__":
    sys.exit(main())

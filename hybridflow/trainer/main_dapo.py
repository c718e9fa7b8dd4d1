"""``python -m hybridflow.trainer.main_dapo key=value ...``: DAPO as verl-recipe's ``recipe.dapo.main_dapo`` runs it.

main_ppo started from the settings of the recipe's ``dapo_trainer.yaml``: the ``dapo`` reward manager (with its
overlong buffer, off until ``reward_model.overlong_buffer.enable=True``), generation batches the size of the
training batch (``algorithm.filter_groups.enable=True`` turns on dynamic sampling), project ``verl-dapo``. A
``--config-path/--config-name`` YAML and the command line go on top, as the recipe's Hydra config does.
"""

from __future__ import annotations

import sys

from hybridflow.errors import run_entry_point
from hybridflow.trainer.main_ppo import run_from_args

DAPO_DEFAULTS = ("reward_model.reward_manager=dapo", "data.gen_batch_size=${data.train_batch_size}",
                 "trainer.project_name=verl-dapo")
"""What verl-recipe's dapo/config/dapo_trainer.yaml sets on top of verl's ppo_trainer.yaml."""
USAGE_SUMMARY = "DAPO (verl-recipe's recipe.dapo.main_dapo): main_ppo with the recipe's defaults."


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    return run_entry_point(lambda a: run_from_args(a, prog="python -m hybridflow.trainer.main_dapo",
                                                   summary=USAGE_SUMMARY, defaults=DAPO_DEFAULTS), args)


if __name__ == "__main__":
    sys.exit(main())

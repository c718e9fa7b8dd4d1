"""One-step off-policy PPO / GRPO (verl's ``one_step_off_policy`` recipe): the rollout for step k + 1 runs
while the actor trains on step k, weights synced after each update. It is the fully async trainer with
``async_training.staleness_threshold=1`` and ``trigger_parameter_sync_step=1`` (overridable)::

    python -m hybridflow.trainer.main_one_step_off data.train_files=... ...
"""

from __future__ import annotations

import sys

from hybridflow.trainer.main_fully_async import run_async_from_args
from hybridflow.errors import run_entry_point

ONE_STEP_OFF = ("async_training.staleness_threshold=1", "async_training.trigger_parameter_sync_step=1")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    return run_entry_point(lambda a: run_async_from_args(a, prog="python -m hybridflow.trainer.main_one_step_off",
                                                         defaults=ONE_STEP_OFF), args)


if __name__ == "__main__":
    sys.exit(main())

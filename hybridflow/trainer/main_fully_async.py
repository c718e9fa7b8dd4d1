"""Fully asynchronous PPO / GRPO (verl's ``fully_async_policy`` recipe), with main_ppo's keys plus
``async_training.*`` and ``rollout.total_rollout_steps``::

    python -m hybridflow.trainer.main_fully_async async_training.staleness_threshold=1 ...
"""

from __future__ import annotations

import logging
import sys

from hybridflow.config import PPOConfig, load_config, split_config_args
from hybridflow.config.loader import help_requested, trainer_usage
from hybridflow.errors import run_entry_point
from hybridflow.trainer.async_ppo import AsyncPPOTrainer, async_training_steps, check_async_config
from hybridflow.trainer.main_ppo import preflight, run_ppo

logger = logging.getLogger(__name__)

USAGE_SUMMARY = "Fully async PPO / GRPO: a rollouter thread runs ahead of the trainer (async_training.* keys)."


def adopt_streamed_batches(cfg: PPOConfig) -> None:
    """verl's fully async recipe streams prompts (``data.train_batch_size=0``, ``data.gen_batch_size=1``) and its
    trainer takes ``require_batches`` mini-batches of ``ppo_mini_batch_size`` prompts per step. Here the rollouter
    generates whole prompt batches, so that step is ``require_batches`` batches of ppo_mini_batch_size prompts:
    the same prompts per step, generated a batch at a time (said once on the console)."""
    data = cfg.data
    if data.train_batch_size != 0:
        return
    data.train_batch_size = cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    data.gen_batch_size = None
    logger.warning("hybridflow: data.train_batch_size=0 (verl's streamed fully async batches): the rollouter "
                   "generates batches of actor.ppo_mini_batch_size=%d prompts, %d per trainer step "
                   "(async_training.require_batches)", data.train_batch_size, cfg.async_training.require_batches)


def async_preflight(cfg: PPOConfig) -> None:
    """main_ppo's pre-load checks after the async translations and checks."""
    adopt_streamed_batches(cfg)
    check_async_config(cfg)
    preflight(cfg)


def run_async_from_args(args: list[str], *, prog: str, defaults: tuple[str, ...] = ()) -> int:
    """``[--config-path D --config-name N] key=value ...`` -> an async run; ``defaults`` go before the user's."""
    if help_requested(args):
        print(trainer_usage(prog, USAGE_SUMMARY, "ppo"), end="")
        return 0
    config_file, overrides = split_config_args(args)
    cfg = load_config(PPOConfig, list(defaults) + list(overrides), config_file)
    async_preflight(cfg)
    run_ppo(cfg, trainer_class=AsyncPPOTrainer, count_steps=async_training_steps)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    return run_entry_point(lambda a: run_async_from_args(a, prog="python -m hybridflow.trainer.main_fully_async"), args)


if __name__ == "__main__":
    sys.exit(main())

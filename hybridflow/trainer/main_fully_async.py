"""Fully asynchronous PPO / GRPO (verl's ``fully_async_policy`` recipe), with main_ppo's keys plus
``async_training.*`` and ``rollout.total_rollout_steps``::

    python -m hybridflow.trainer.main_fully_async async_training.staleness_threshold=1 ...
"""

from __future__ import annotations

import logging
import sys

from hybridflow.config import PPOConfig, load_config, split_config_args
from hybridflow.config.loader import help_requested, trainer_usage
from hybridflow.trainer.entry import partial_rollouts
from hybridflow.errors import run_entry_point
from hybridflow.trainer.loop.async_source import AsyncSource, async_training_steps, check_async_config
from hybridflow.trainer.loop.generation import Generation, PromptStream
from hybridflow.trainer.loop.parts import Parts, Run
from hybridflow.trainer.loop.weight_sync import weight_sync_for
from hybridflow.trainer.main_ppo import preflight, run_ppo
from hybridflow.trainer.loop.ppo_update import PPOUpdate

logger = logging.getLogger(__name__)

USAGE_SUMMARY = "Fully async PPO / GRPO: a rollouter thread runs ahead of the trainer (async_training.* keys)."


def async_parts(run: Run) -> Parts:
    """The fully async choice: a rollouter running ahead (partial rollouts with ``partial_rollout``), a weight sync
    every ``trigger_parameter_sync_step`` steps with versions, and the PPO update on the proximal policy's
    log-probs (``compute_prox_log_prob``) or the behaviour ones."""
    cfg, partial = run.cfg, partial_rollouts(run.cfg)
    sync = weight_sync_for(cfg, run.workers, asynchronous=True, partial=partial)
    source = AsyncSource(Generation(run, partial=partial), PromptStream(run.train_loader), sync, cfg=cfg,
                         total_steps=run.total_steps)
    return Parts(source=source, sync=sync, validation_every=async_validation_every(cfg),
                 update=PPOUpdate(run, behaviour_as_old=not cfg.async_training.compute_prox_log_prob))


def async_validation_every(cfg: PPOConfig) -> int:
    """Steps between validations: ``rollout.test_freq`` weight syncs (verl's fully async recipe), else
    ``trainer.test_freq`` steps."""
    if cfg.rollout.test_freq is None:
        return cfg.trainer.test_freq
    return cfg.rollout.test_freq * cfg.async_training.trigger_parameter_sync_step


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
    run_ppo(cfg, parts=async_parts, count_steps=async_training_steps)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    return run_entry_point(lambda a: run_async_from_args(a, prog="python -m hybridflow.trainer.main_fully_async"), args)


if __name__ == "__main__":
    sys.exit(main())

"""``python -m hybridflow.trainer.main_ppo key=value ...``: build the PPO workers from a config and train.

Order matters for the user: everything that can be checked without loading a model
(keys, types, batch arithmetic, files, registered names, the model's context length
from its config.json) is checked first, so a typo costs a second, not a model load.
"""

from __future__ import annotations

import functools
import logging
import sys

from hybridflow.algos import (advantage_spec, get_advantage, get_policy_loss, list_kl_penalties, list_loss_agg_modes,
                             policy_loss_spec)
from hybridflow.algos.errors import UnknownAlgorithmError
from hybridflow.algos.rollout_correction.checks import pf_ppo_problems, rollout_correction_problems
from hybridflow.config import PPOConfig, config_value, validate_ppo_config
from hybridflow.config.loader import run_from_config_args
from hybridflow.config.validate import prime_filtering
from hybridflow.errors import ConfigError, run_entry_point
from hybridflow.trainer.entry import (check_rollout_model, check_user_data_classes, engine_and_logger_problems,
                                     model_context_length)
from hybridflow.trainer.loop.fit import PPORun, train_and_report
from hybridflow.trainer.loop.generation import Generation, PromptStream
from hybridflow.trainer.loop.parts import Parts, Run
from hybridflow.trainer.loop.sync_sources import AccuracyFilter, GroupRefill, SyncSource
from hybridflow.trainer.loop.weight_sync import weight_sync_for
from hybridflow.trainer.loop.ppo_update import PPOUpdate
from hybridflow.trainer.roles.reward import reward_manager_problems
from hybridflow.trainer.roles.assembly import build_loop

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------ checks before loading
def check_registered_names(cfg: PPOConfig) -> None:
    """Names that live in registries: each unknown one is an error listing the valid ones."""
    actor = cfg.actor_rollout_ref.actor
    problems = []
    for lookup in (lambda: get_advantage(cfg.algorithm.adv_estimator),
                   lambda: get_policy_loss(actor.policy_loss.loss_mode)):
        try:
            lookup()
        except UnknownAlgorithmError as err:
            problems.append(str(err))
    checks = (("actor_rollout_ref.actor.loss_agg_mode", actor.loss_agg_mode, list_loss_agg_modes()),
              ("actor_rollout_ref.actor.kl_loss_type", actor.kl_loss_type, list_kl_penalties()),
              ("algorithm.kl_penalty", cfg.algorithm.kl_penalty, list_kl_penalties()))
    problems += name_problems(checks) + engine_and_logger_problems(cfg) + reward_manager_problems(cfg)
    if problems:
        raise ConfigError("\n".join(problems))


def name_problems(checks) -> list[str]:
    """One message for each (key, value, valid names) whose value is not a valid name."""
    return [f"{key}={value!r} is not one of {', '.join(names)}" for key, value, names in checks if value not in names]


def check_algorithm_settings(cfg: PPOConfig) -> None:
    """Settings the chosen estimator / loss / correction needs, checked before any model is loaded."""
    algo, actor = cfg.algorithm, cfg.actor_rollout_ref.actor
    setting = functools.partial(config_value, cfg)
    problems = spec_problems(cfg, lambda: advantage_spec(algo.adv_estimator))
    problems += spec_problems(cfg, lambda: policy_loss_spec(actor.policy_loss.loss_mode))
    problems += pf_ppo_problems(setting) + rollout_correction_problems(setting)
    if problems:
        raise ConfigError("\n".join(problems))


def spec_problems(cfg: PPOConfig, spec) -> list[str]:
    """What the chosen estimator or loss checks itself (its spec's ``check``, in algos/); an unknown name has no
    spec and is reported by check_registered_names."""
    try:
        return spec().check(functools.partial(config_value, cfg))
    except UnknownAlgorithmError:
        return []


def warn_about_ignored_gpus(cfg: PPOConfig) -> None:
    """verl scripts say ``trainer.n_gpus_per_node=8``; the default local backend is one process.
    A warning, not an error: the same script then runs unchanged on a laptop, and the line names
    the switch that gives the GPUs to the run."""
    trainer = cfg.trainer
    if trainer.backend == "local" and trainer.nnodes * trainer.n_gpus_per_node > 1:
        logger.warning("hybridflow: warning: trainer.nnodes x trainer.n_gpus_per_node = %d workers, but trainer.backend=local runs one "
                       "process: set trainer.backend=ray to use them", trainer.nnodes * trainer.n_gpus_per_node)
    sizes = [cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size, cfg.critic.ulysses_sequence_parallel_size]
    if trainer.backend == "local" and any(size > 1 for size in sizes):
        logger.warning("hybridflow: warning: ulysses_sequence_parallel_size > 1 splits sequences over ranks, but "
                       "trainer.backend=local runs one process with whole sequences: set trainer.backend=ray")


def preflight(cfg: PPOConfig) -> None:
    """Every check that needs no model weights: names, availability of the backends, batch arithmetic,
    files, the model's context from its config.json. Raises one ConfigError listing every problem."""
    model = cfg.actor_rollout_ref.model
    checks = (lambda: check_registered_names(cfg), lambda: check_algorithm_settings(cfg),
              lambda: validate_ppo_config(cfg, model_max_len=model_context_length(
                  model.path, model.trust_remote_code, dict(model.override_config))),
              lambda: check_user_data_classes(cfg.data), lambda: check_rollout_model(cfg))
    problems = []
    for check in checks:
        try:
            check()
        except ConfigError as err:
            problems += str(err).splitlines()
    if problems:
        raise ConfigError("\n".join(problems))
    warn_about_ignored_gpus(cfg)


# ------------------------------------------------------------------ the parts main_ppo chooses


def group_selection(cfg: PPOConfig) -> GroupRefill | AccuracyFilter | None:
    """The groups a step trains on: DAPO's dynamic sampling (``algorithm.filter_groups.enable``), PRIME's accuracy
    filter over an oversampled batch (``data.filter_accuracy`` ...), or every group (validation refuses both)."""
    n, wanted = cfg.actor_rollout_ref.rollout.n, cfg.data.train_batch_size
    if cfg.algorithm.filter_groups.enable:
        return GroupRefill(cfg.algorithm.filter_groups, n=n, wanted=wanted)
    if prime_filtering(cfg.data):
        return AccuracyFilter(cfg.data, n=n, wanted=wanted)
    return None


def ppo_parts(run: Run) -> Parts:
    """main_ppo's choice: a synchronous source (with DAPO's refill or PRIME's filter: ``group_selection``), the
    PPO update, and a weight sync after every update."""
    cfg = run.cfg
    refill = group_selection(cfg)
    source = SyncSource(Generation(run), PromptStream(run.train_loader), refill=refill)
    return Parts(source=source, sync=weight_sync_for(cfg, run.workers, asynchronous=False), update=PPOUpdate(run),
                 validation_every=cfg.trainer.test_freq)


def run_ppo(cfg: PPOConfig, *, parts=ppo_parts, **build_kwargs) -> PPORun:
    """Validate, build, train; print the summary and write the plots."""
    preflight(cfg)
    return train_and_report(build_loop(cfg, parts=parts, **build_kwargs), cfg)


USAGE_SUMMARY = "PPO / GRPO / DAPO / ... training with verl's main_ppo keys (also: hybridflow ppo)."


def run_from_args(args: list[str], *, prog: str = "python -m hybridflow.trainer.main_ppo",
                  summary: str = USAGE_SUMMARY, defaults: tuple[str, ...] = (), adapt=None, parts=ppo_parts) -> int:
    """``[--config-path D --config-name N] key=value ...`` -> a run (shared by ``hybridflow ppo`` and the recipes'
    entry points, which pass their ``defaults`` and ``adapt``: see ``run_from_config_args``); ``parts(run)``
    (another entry point's choice of rollout source, weight sync and update) builds the loop."""
    return run_from_config_args(args, schema=PPOConfig, run=functools.partial(run_ppo, parts=parts), trainer="ppo",
                                prog=prog, summary=summary, defaults=defaults, adapt=adapt)


def main(argv: list[str] | None = None) -> int:
    return run_entry_point(run_from_args, list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())

"""The checks that run before any model is loaded: the thin entry that runs each section's own checks.

Each section's checks live beside its schema (``config/data.py``, ``actor.py``, ``rollout.py``, ``algorithm.py``,
``trainer.py``, ``reward.py``, ``sft.py``, ...); what one estimator or loss needs is its spec's ``check`` in
``algos/``. Each problem is one line that names the keys involved and the fix; all problems found are reported
together. Checks that need a registry outside config (rollout backends, trackers, reward managers) are run by the
trainer at start-up, also before any model loads.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from hybridflow.config.actor import check_clip_ratios, check_ppo_batches, check_sequence_parallel
from hybridflow.config.algorithm import algorithm_problems, critic_enabled, implicit_prm_enabled
from hybridflow.config.algorithm import estimator_spec, reference_enabled  # noqa: F401 - re-exported
from hybridflow.config.checks import check_choice, check_output_folder, check_sp_size, check_strategies
from hybridflow.config.common import LR_SCHEDULES, optim_problems
from hybridflow.config.data import TRUNCATION_MODES, check_generation_batch, check_multimodal
from hybridflow.config.data import generation_batch_size, prime_filtering  # noqa: F401 - re-exported
from hybridflow.config.distillation import distillation_problems
from hybridflow.config.reward import SANDBOX_MIN_MEMORY_MB, sandbox_problems  # noqa: F401 - re-exported
from hybridflow.config.rollout import check_rollout, multi_turn_problems
from hybridflow.config.sft import check_sft_batches, sft_data_parallel_size, sft_model_path, sft_packed
from hybridflow.config.sft import sft_micro_batch_size_per_gpu  # noqa: F401 - re-exported
from hybridflow.config.trainer import (RESUME_MODES, check_best_checkpoint, check_split_placement, ppo_world_size,
                                       trainer_problems)
from hybridflow.config.trainer import ppo_ranks, split_placement  # noqa: F401 - re-exported
from hybridflow.config.verl_versions import warn_version_differences
from hybridflow.errors import ConfigError

logger = logging.getLogger(__name__)


def as_list(value: Any) -> list:
    """A file/logger key may hold one string or a list of them."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def looks_like_local_path(path: str) -> bool:
    """Hub ids look like ``org/name``; anything absolute, relative or with ~ is a local path."""
    return path.startswith(("/", ".", "~")) or os.path.sep + os.path.sep in path or path.count("/") > 1


def _check_files(problems: list[str], key: str, files: Any) -> None:
    for path in as_list(files):
        full = os.path.expanduser(str(path))
        if not (os.path.isfile(full) or os.path.isdir(full)):  # a folder's contents are checked as it is read
            problems.append(
                f"{key}: file '{path}' does not exist (write one with `python -m hybridflow.data.preprocess.reasoning_gym"
                f" --task chain_sum --local_save_dir DIR` or point {key} at your parquet/jsonl)"
            )


def _check_model_path(problems: list[str], key: str, path: Any) -> None:
    if path in (None, "", "???"):
        problems.append(f"{key} is not set: pass {key}=/path/to/hf_model (or `hybridflow models tiny DIR` for a test model)")
        return
    full = os.path.expanduser(str(path))
    if looks_like_local_path(str(path)) and not os.path.isdir(full):
        problems.append(f"{key}: model folder '{path}' does not exist (a hub id looks like org/name)")


def _check_verl_versions(problems: list[str], cfg: Any) -> None:
    """Keys whose meaning changed between verl versions (``config/verl_versions.py``): a conflict is a problem,
    the rest is said once."""
    try:
        warn_version_differences(cfg, with_critic=critic_enabled(cfg))
    except ConfigError as err:
        problems.append(str(err))


def raise_if_problems(problems: list[str]) -> None:
    if problems:
        raise ConfigError("\n".join(problems))


def validate_ppo_config(cfg: Any, *, model_max_len: int | None = None, check_paths: bool = True) -> None:
    """Raise ConfigError listing every problem of a resolved PPOConfig."""
    problems: list[str] = []
    if check_paths:
        _check_model_path(problems, "actor_rollout_ref.model.path", cfg.actor_rollout_ref.model.path)
        _check_files(problems, "data.train_files", cfg.data.train_files)
        _check_files(problems, "data.val_files", cfg.data.val_files)
        if cfg.custom_reward_function.path and not os.path.isfile(os.path.expanduser(cfg.custom_reward_function.path)):
            problems.append(f"custom_reward_function.path: file '{cfg.custom_reward_function.path}' does not exist")
    check_choice(problems, "data.truncation", cfg.data.truncation, TRUNCATION_MODES)
    arf = cfg.actor_rollout_ref
    check_strategies(problems, {"actor_rollout_ref.actor.strategy": arf.actor.strategy,
                                "actor_rollout_ref.ref.strategy": arf.ref.strategy, "critic.strategy": cfg.critic.strategy})
    check_ppo_batches(problems, cfg, ppo_world_size(cfg))
    problems += algorithm_problems(cfg)
    check_generation_batch(problems, cfg)
    check_multimodal(problems, cfg)
    check_clip_ratios(problems, cfg.actor_rollout_ref.actor)
    check_sequence_parallel(problems, cfg)
    check_rollout(problems, cfg, model_max_len)
    problems += multi_turn_problems(cfg.actor_rollout_ref.rollout.multi_turn)
    problems += trainer_problems(cfg.trainer)
    check_split_placement(problems, cfg)
    check_best_checkpoint(problems, cfg)
    problems += sandbox_problems(cfg.reward_model.sandbox_fusion)
    problems += optim_problems("actor_rollout_ref.actor.optim", cfg.actor_rollout_ref.actor.optim)
    if critic_enabled(cfg):
        problems += optim_problems("critic.optim", cfg.critic.optim)
    if implicit_prm_enabled(cfg):
        problems += optim_problems("reward_model.model.optim", cfg.reward_model.model.optim)
    _check_verl_versions(problems, cfg)
    problems.extend(distillation_problems(cfg, check_paths=check_paths))
    raise_if_problems(problems)


def validate_sft_config(cfg: Any, *, world_size: int = 1, model_max_len: int | None = None,
                        check_paths: bool = True) -> None:
    """Raise ConfigError listing every problem of a resolved SFTConfig."""
    problems: list[str] = []
    if check_paths:
        _check_model_path(problems, "model.partial_pretrain", sft_model_path(cfg))
        _check_files(problems, "data.train_files", cfg.data.train_files)
        _check_files(problems, "data.val_files", cfg.data.val_files)
    data = cfg.data
    check_sft_batches(problems, data, sft_data_parallel_size(cfg, world_size))
    check_choice(problems, "data.truncation", data.truncation, ("error", "left", "right"))
    check_strategies(problems, {"model.strategy": cfg.model.strategy})
    if data.pad_mode is not None:
        check_choice(problems, "data.pad_mode", data.pad_mode, ("no_padding", "right"))
    check_choice(problems, "optim.lr_scheduler", cfg.optim.lr_scheduler, LR_SCHEDULES)
    problems += optim_problems("optim", cfg.optim)
    if model_max_len is not None and data.max_length > model_max_len:
        problems.append(f"data.max_length={data.max_length} exceeds the model's context of {model_max_len} tokens")
    check_choice(problems, "trainer.resume_mode", cfg.trainer.resume_mode, RESUME_MODES)
    check_output_folder(problems, "trainer.default_local_dir", cfg.trainer.default_local_dir)
    check_sp_size(problems, "ulysses_sequence_parallel_size", cfg.ulysses_sequence_parallel_size, world_size,
                  packed=sft_packed(cfg), packing_key="use_remove_padding", ranks_name="torchrun's processes")
    raise_if_problems(problems)

"""Cross-field checks that run before any model is loaded.

Each problem is one line that names the keys involved and the fix; all problems found
are reported together. Checks that need a registry (advantage estimator names, policy
losses, rollout backends, trackers) live with those registries and are run by the
trainer at start-up, also before any model loads.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

from hybridflow.algos.registry import AdvantageSpec, UnknownAlgorithmError, advantage_spec, list_kl_controllers
from hybridflow.config.checks import check_choice as _check_choice
from hybridflow.config.checks import check_output_folder as _check_output_folder
from hybridflow.config.checks import check_positive as _check_positive
from hybridflow.config.common import LR_SCHEDULES, optim_problems
from hybridflow.config.distillation import distillation_problems
from hybridflow.config.loader import MEGATRON
from hybridflow.config.reward import SANDBOX_MIN_MEMORY_MB, sandbox_problems  # noqa: F401 - re-exported
from hybridflow.config.rollout import multi_turn_problems
from hybridflow.config.trainer import RESUME_MODES, trainer_problems
from hybridflow.config.sft import sft_packed
from hybridflow.config.verl_versions import warn_version_differences
from hybridflow.errors import ConfigError

logger = logging.getLogger(__name__)
TRUNCATION_MODES = ("error", "left", "right", "middle")


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


def _check_strategies(problems: list[str], strategies: dict[str, str]) -> None:
    """verl's training backends: fsdp and fsdp2 both mean FSDP2 here; megatron gets the one line saying so."""
    for key, value in strategies.items():
        if value == "megatron":
            problems.append(f"{key}=megatron: {MEGATRON}")
        else:
            _check_choice(problems, key, value, ("fsdp", "fsdp2"))


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


def ppo_ranks(cfg: Any) -> int:
    """Ranks of a worker group: 1 on the local backend, else ``nnodes x n_gpus_per_node``."""
    if cfg.trainer.backend == "local":
        return 1
    return cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node


def ppo_world_size(cfg: Any, sp_size: int | None = None) -> int:
    """Data-parallel size of a worker group: its ranks over its sequence-parallel size (default: the actor's)."""
    sp_size = cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size if sp_size is None else sp_size
    return max(1, ppo_ranks(cfg) // sp_size)


def _check_batch_sizes(problems: list[str], cfg: Any, world: int) -> None:
    data, actor, rollout = cfg.data, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    for key, value in (("data.train_batch_size", data.train_batch_size),
                       ("actor_rollout_ref.actor.ppo_mini_batch_size", actor.ppo_mini_batch_size),
                       ("actor_rollout_ref.rollout.n", rollout.n),
                       ("actor_rollout_ref.actor.ppo_epochs", actor.ppo_epochs)):
        _check_positive(problems, key, value)
    if any(v is None or v <= 0 for v in (data.train_batch_size, actor.ppo_mini_batch_size, rollout.n)):
        return
    if data.train_batch_size % actor.ppo_mini_batch_size:
        problems.append(
            f"data.train_batch_size={data.train_batch_size} (x rollout.n={rollout.n}) is not divisible by "
            f"actor_rollout_ref.actor.ppo_mini_batch_size={actor.ppo_mini_batch_size} (x rollout.n): "
            "make the mini-batch a divisor of the train batch"
        )
    _check_micro(problems, "actor_rollout_ref.actor", actor.ppo_mini_batch_size * rollout.n, world,
                 actor.ppo_micro_batch_size_per_gpu, actor.use_dynamic_bsz)
    if critic_enabled(cfg):
        critic = cfg.critic
        critic_world = ppo_world_size(cfg, critic.ulysses_sequence_parallel_size)
        _check_micro(problems, "critic", critic.ppo_mini_batch_size * rollout.n, critic_world,
                     critic.ppo_micro_batch_size_per_gpu, critic.use_dynamic_bsz)
    if (data.train_batch_size * rollout.n) % world:
        problems.append(
            f"data.train_batch_size * rollout.n = {data.train_batch_size * rollout.n} sequences cannot be split "
            f"evenly over {world} data-parallel workers: make it a multiple of {world}"
        )


def _check_micro(problems: list[str], section: str, mini_sequences: int, world: int,
                 micro_per_gpu: int | None, dynamic: bool) -> None:
    if mini_sequences % world:
        problems.append(
            f"{section}.ppo_mini_batch_size x rollout.n = {mini_sequences} sequences is not divisible by the "
            f"data-parallel size {world} (trainer.nnodes x trainer.n_gpus_per_node)"
        )
        return
    per_rank = mini_sequences // world
    if micro_per_gpu is not None and not dynamic:
        if micro_per_gpu <= 0:
            problems.append(f"{section}.ppo_micro_batch_size_per_gpu={micro_per_gpu} must be positive")
        elif per_rank % micro_per_gpu:
            problems.append(
                f"{section}: mini-batch of {per_rank} sequences per worker (ppo_mini_batch_size x rollout.n / "
                f"{world} workers) is not divisible by ppo_micro_batch_size_per_gpu={micro_per_gpu}"
            )


def critic_enabled(cfg: Any) -> bool:
    """The critic runs when forced on, or by default exactly for estimators registered with ``needs_values``."""
    if cfg.critic.enable is not None:
        return bool(cfg.critic.enable)
    return estimator_spec(cfg.algorithm.adv_estimator).needs_values


def reference_enabled(cfg: Any) -> bool:
    """Reference log-probs are computed when a KL term uses them (in the loss or in the reward) or the estimator's
    spec needs them (``needs_reference``: PRIME's implicit PRM takes its log-ratio to them)."""
    return bool(cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward
                or estimator_spec(cfg.algorithm.adv_estimator).needs_reference)


def implicit_prm_enabled(cfg: Any) -> bool:
    """PRIME's implicit PRM is built and trained exactly for estimators registered with ``needs_implicit_prm``."""
    return estimator_spec(cfg.algorithm.adv_estimator).needs_implicit_prm


def estimator_spec(name: str | None) -> AdvantageSpec:
    """The estimator's registered spec (algos/registry.py, the one module of algos that config reads: what an
    estimator needs); an unknown name needs nothing here and is reported by the registered-name check."""
    try:
        return advantage_spec(name)
    except UnknownAlgorithmError:
        return AdvantageSpec()


def split_placement(cfg: Any) -> bool:
    """The rollout runs in a pool of processes of its own (``rollout.n_gpus_per_node`` > 0), not in the training
    processes (the hybrid engine)."""
    return cfg.rollout.n_gpus_per_node > 0


def _check_algorithm(problems: list[str], cfg: Any) -> None:
    algo, actor = cfg.algorithm, cfg.actor_rollout_ref.actor
    if estimator_spec(algo.adv_estimator).needs_values and cfg.critic.enable is False:
        problems.append(f"algorithm.adv_estimator={algo.adv_estimator} needs a critic but critic.enable=False: "
                        "enable the critic or pick a critic-free estimator such as grpo")
    if critic_enabled(cfg) and cfg.critic.model.path in (None, ""):
        problems.append(f"critic.model.path is not set (it is needed because adv_estimator={algo.adv_estimator})")
    _check_choice(problems, "algorithm.kl_ctrl.type", algo.kl_ctrl.type, tuple(list_kl_controllers()))
    if algo.filter_groups.enable and not algo.filter_groups.metric:
        problems.append("algorithm.filter_groups.enable=True needs algorithm.filter_groups.metric (acc, score or seq_reward)")
    _check_gen_batch_size(problems, cfg)
    if actor.clip_ratio_c <= 1.0:
        problems.append(f"actor_rollout_ref.actor.clip_ratio_c={actor.clip_ratio_c} must be > 1 (dual-clip bound)")
    for name in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
        value = getattr(actor, name)
        if value is not None and not 0 <= value < math.inf:
            problems.append(f"actor_rollout_ref.actor.{name}={value} must be a finite number >= 0 (PPO's clip epsilon, "
                            "typically 0.2; DAPO's clip_ratio_high is 0.28)")


def _check_sequence_parallel(problems: list[str], cfg: Any) -> None:
    """Ulysses needs packed rows and a size that divides the group's ranks; the reference lives in
    the actor's processes, so it splits sequences like the actor or not at all."""
    arr, ranks = cfg.actor_rollout_ref, cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    sections = [("actor_rollout_ref.actor", arr.actor.ulysses_sequence_parallel_size, arr.model, "actor_rollout_ref.model")]
    if critic_enabled(cfg):
        sections.append(("critic", cfg.critic.ulysses_sequence_parallel_size, cfg.critic.model, "critic.model"))
    for section, size, model, model_key in sections:
        _check_sp_size(problems, f"{section}.ulysses_sequence_parallel_size", size, ranks,
                       packed=model.use_remove_padding or model.use_shared_prompt, packing_key=f"{model_key}.use_remove_padding")
    if arr.ref.ulysses_sequence_parallel_size not in (1, arr.actor.ulysses_sequence_parallel_size):
        problems.append(f"actor_rollout_ref.ref.ulysses_sequence_parallel_size={arr.ref.ulysses_sequence_parallel_size} "
                        "differs from actor_rollout_ref.actor.ulysses_sequence_parallel_size="
                        f"{arr.actor.ulysses_sequence_parallel_size}: the reference runs in the actor's processes and "
                        "splits sequences over the same groups (or, at 1, runs them whole); drop the ref key "
                        "(it follows the actor)")


def _check_sp_size(problems: list[str], key: str, size: int, ranks: int, *, packed: bool, packing_key: str,
                   ranks_name: str = "trainer.nnodes x trainer.n_gpus_per_node") -> None:
    if size < 1:
        problems.append(f"{key}={size} must be >= 1")
    if size > 1 and ranks > 1 and ranks % size:
        problems.append(f"{key}={size} must divide the {ranks} ranks of the worker group ({ranks_name})")
    if size > 1 and not packed:
        problems.append(f"{key}={size} splits packed rows over ranks: set {packing_key}=True")


def prime_filtering(data: Any) -> bool:
    """PRIME's accuracy / truncation filter or its oversampling is asked for (``data.*``, verl-recipe's keys)."""
    return bool(data.filter_accuracy or data.filter_truncate or data.oversample_factor != 1.0)


def generation_batch_size(data: Any) -> int:
    """Prompts a step generates from: ``gen_batch_size`` (DAPO), else ``train_batch_size`` x PRIME's
    ``oversample_factor`` (1 unless set), as verl-recipe's PRIME trainer sizes its data loader."""
    return data.gen_batch_size or int(data.train_batch_size * data.oversample_factor)


def _check_prime_filter(problems: list[str], cfg: Any) -> None:
    data = cfg.data
    if not prime_filtering(data):
        return
    if data.oversample_factor < 1.0:
        problems.append(f"data.oversample_factor={data.oversample_factor} must be >= 1 (PRIME generates that many "
                        "times the train batch's prompts and keeps train_batch_size of them)")
    if cfg.algorithm.filter_groups.enable:
        problems.append("PRIME's filter (data.filter_accuracy / filter_truncate / oversample_factor) and DAPO's "
                        "algorithm.filter_groups.enable=True both pick the groups to train on: keep one")
    if data.gen_batch_size is not None and data.gen_batch_size != data.train_batch_size:
        problems.append(f"data.gen_batch_size={data.gen_batch_size} with PRIME's filter: the generation batch is "
                        "train_batch_size x data.oversample_factor; drop data.gen_batch_size")


def _check_gen_batch_size(problems: list[str], cfg: Any) -> None:
    """data.gen_batch_size only means something with DAPO's dynamic sampling."""
    gen, train = cfg.data.gen_batch_size, cfg.data.train_batch_size
    _check_prime_filter(problems, cfg)
    if gen is None or prime_filtering(cfg.data):
        return
    _check_positive(problems, "data.gen_batch_size", gen)
    if gen > 0 and gen != train and not cfg.algorithm.filter_groups.enable:
        problems.append(f"data.gen_batch_size={gen} differs from data.train_batch_size={train} but "
                        "algorithm.filter_groups.enable=False: generation batches larger or smaller than the "
                        "train batch are for dynamic sampling; enable filter_groups or drop data.gen_batch_size")


def _check_rollout(problems: list[str], cfg: Any, model_max_len: int | None) -> None:
    rollout, data = cfg.actor_rollout_ref.rollout, cfg.data
    if not 0.0 <= rollout.over_sample_rate < 1.0:
        problems.append(f"actor_rollout_ref.rollout.over_sample_rate={rollout.over_sample_rate} must be in [0, 1): "
                        "the share of a batch's samples aborted once the rest have finished")
    for key, top_k in (("rollout.top_k", rollout.top_k), ("rollout.val_kwargs.top_k", rollout.val_kwargs.top_k)):
        if top_k < -1:
            problems.append(f"actor_rollout_ref.{key}={top_k} must be -1 or 0 (off) or a positive number of tokens")
    if cfg.actor_rollout_ref.actor.use_rollout_log_probs and (rollout.top_p < 1 or rollout.top_k > 0):
        problems.append("actor_rollout_ref.actor.use_rollout_log_probs=True needs rollout.top_p=1 and rollout.top_k=-1: "
                        "the engine's log-probs are of the filtered distribution, the trainer's are not")
    if cfg.actor_rollout_ref.actor.use_rollout_log_probs and rollout.repetition_penalty != 1:
        problems.append("actor_rollout_ref.actor.use_rollout_log_probs=True needs rollout.repetition_penalty=1: the "
                        "engine's log-probs are of the penalised distribution, the trainer's are not")
    if not rollout.repetition_penalty > 0:
        problems.append(f"actor_rollout_ref.rollout.repetition_penalty={rollout.repetition_penalty} must be > 0 "
                        "(1.0 = off)")
    if rollout.temperature < 0:
        problems.append(f"actor_rollout_ref.rollout.temperature={rollout.temperature} must be >= 0")
    if not 0 < rollout.top_p <= 1:
        problems.append(f"actor_rollout_ref.rollout.top_p={rollout.top_p} must be in (0, 1]")
    _check_positive(problems, "actor_rollout_ref.rollout.val_kwargs.n", rollout.val_kwargs.n)
    _check_token_budget(problems, rollout)
    _check_positive(problems, "data.max_prompt_length", data.max_prompt_length)
    _check_positive(problems, "data.max_response_length", data.max_response_length)
    total = data.max_prompt_length + data.max_response_length
    if model_max_len is not None and total > model_max_len:
        problems.append(
            f"data.max_prompt_length + data.max_response_length = {total} exceeds the model's context of "
            f"{model_max_len} tokens: lower one of them"
        )


def _check_token_budget(problems: list[str], rollout: Any) -> None:
    """The step budget is positive (an engine that chunks its prefill checks the rest:
    :func:`hybridflow.rollout.engine.engine_config_problems`)."""
    key = "actor_rollout_ref.rollout.max_num_batched_tokens"
    _check_positive(problems, key, rollout.max_num_batched_tokens)


def _check_verl_versions(problems: list[str], cfg: Any) -> None:
    """Keys whose meaning changed between verl versions (``config/verl_versions.py``): a conflict is a problem,
    the rest is said once."""
    try:
        warn_version_differences(cfg, with_critic=critic_enabled(cfg))
    except ConfigError as err:
        problems.append(str(err))


def _check_best_checkpoint(problems: list[str], cfg: Any) -> None:
    """keep_best_checkpoint / early_stop_patience act on validation scores: validation must run."""
    trainer = cfg.trainer
    if trainer.early_stop_patience < 0:
        problems.append(f"trainer.early_stop_patience={trainer.early_stop_patience}: use 0 (never) or a positive count")
    wanted = [k for k, on in (("trainer.keep_best_checkpoint", trainer.keep_best_checkpoint),
                              ("trainer.early_stop_patience", trainer.early_stop_patience > 0)) if on]
    if wanted and (not cfg.data.val_files or trainer.test_freq <= 0):
        problems.append(f"{' and '.join(wanted)} select on validation scores, but no validation runs: set "
                        "data.val_files and trainer.test_freq > 0 (e.g. trainer.test_freq=10)")
    if trainer.best_metric is not None and not str(trainer.best_metric).startswith(("val-core/", "val-aux/")):
        problems.append(f"trainer.best_metric='{trainer.best_metric}' is not a validation metric: name one that "
                        "starts with val-core/ or val-aux/ (e.g. val-core/<data_source>/reward/mean@1), or null")


def raise_if_problems(problems: list[str]) -> None:
    if problems:
        raise ConfigError("\n".join(problems))


def _check_split_placement(problems: list[str], cfg: Any) -> None:
    """A rollout pool of its own (``rollout.n_gpus_per_node`` > 0) is a set of Ray processes that split each prompt
    batch between them."""
    pool = cfg.rollout
    if pool.n_gpus_per_node < 0 or pool.nnodes < 1:
        problems.append(f"rollout.nnodes={pool.nnodes}, rollout.n_gpus_per_node={pool.n_gpus_per_node}: nnodes must be "
                        ">= 1 and n_gpus_per_node >= 0 (0 = the rollout runs in the training processes)")
        return
    if not split_placement(cfg):
        return
    if cfg.trainer.backend != "ray":
        problems.append(f"rollout.n_gpus_per_node={pool.n_gpus_per_node} places the rollout in processes of its own, "
                        "which needs trainer.backend=ray; or set rollout.n_gpus_per_node=0 (the hybrid engine)")
    ranks = pool.nnodes * pool.n_gpus_per_node
    if cfg.data.train_batch_size % ranks:
        problems.append(f"data.train_batch_size={cfg.data.train_batch_size} prompts cannot be split over the "
                        f"{ranks} rollout processes (rollout.nnodes x rollout.n_gpus_per_node); make it a multiple")


def validate_ppo_config(cfg: Any, *, model_max_len: int | None = None, check_paths: bool = True) -> None:
    """Raise ConfigError listing every problem of a resolved PPOConfig."""
    problems: list[str] = []
    if check_paths:
        _check_model_path(problems, "actor_rollout_ref.model.path", cfg.actor_rollout_ref.model.path)
        _check_files(problems, "data.train_files", cfg.data.train_files)
        _check_files(problems, "data.val_files", cfg.data.val_files)
        if cfg.custom_reward_function.path and not os.path.isfile(os.path.expanduser(cfg.custom_reward_function.path)):
            problems.append(f"custom_reward_function.path: file '{cfg.custom_reward_function.path}' does not exist")
    _check_choice(problems, "data.truncation", cfg.data.truncation, TRUNCATION_MODES)
    arf = cfg.actor_rollout_ref
    _check_strategies(problems, {"actor_rollout_ref.actor.strategy": arf.actor.strategy,
                                 "actor_rollout_ref.ref.strategy": arf.ref.strategy, "critic.strategy": cfg.critic.strategy})
    _check_batch_sizes(problems, cfg, ppo_world_size(cfg))
    _check_algorithm(problems, cfg)
    _check_sequence_parallel(problems, cfg)
    _check_rollout(problems, cfg, model_max_len)
    problems += multi_turn_problems(cfg.actor_rollout_ref.rollout.multi_turn)
    problems += trainer_problems(cfg.trainer)
    _check_split_placement(problems, cfg)
    _check_best_checkpoint(problems, cfg)
    problems += sandbox_problems(cfg.reward_model.sandbox_fusion)
    problems += optim_problems("actor_rollout_ref.actor.optim", cfg.actor_rollout_ref.actor.optim)
    if critic_enabled(cfg):
        problems += optim_problems("critic.optim", cfg.critic.optim)
    if implicit_prm_enabled(cfg):
        problems += optim_problems("reward_model.model.optim", cfg.reward_model.model.optim)
    _check_verl_versions(problems, cfg)
    problems.extend(distillation_problems(cfg, check_paths=check_paths))
    raise_if_problems(problems)


def sft_model_path(cfg: Any) -> str | None:
    """``model.path`` wins over verl's ``model.partial_pretrain``."""
    return cfg.model.path or cfg.model.partial_pretrain


def sft_micro_batch_size_per_gpu(data: Any, world_size: int) -> int:
    """Sequences per forward/backward on each rank: verl's deprecated global ``data.micro_batch_size``
    split over the data-parallel ranks when set, else ``data.micro_batch_size_per_gpu``."""
    if data.micro_batch_size is not None:
        return data.micro_batch_size // world_size
    return data.micro_batch_size_per_gpu


def sft_data_parallel_size(cfg: Any, world_size: int) -> int:
    """Data-parallel workers of an SFT run of ``world_size`` processes: groups of
    ``ulysses_sequence_parallel_size`` processes share one slice of the batch."""
    size = cfg.ulysses_sequence_parallel_size
    return world_size // size if size > 0 and world_size % size == 0 else world_size


def _check_sft_batch_sizes(problems: list[str], data: Any, world_size: int) -> None:
    _check_positive(problems, "data.train_batch_size", data.train_batch_size)
    if data.micro_batch_size is not None:
        _check_positive(problems, "data.micro_batch_size", data.micro_batch_size)
        if data.micro_batch_size > 0 and data.micro_batch_size % world_size:
            problems.append(f"data.micro_batch_size={data.micro_batch_size} (global) is not divisible by the "
                            f"{world_size} data-parallel workers: use data.micro_batch_size_per_gpu instead")
            return
    micro = sft_micro_batch_size_per_gpu(data, world_size)
    _check_positive(problems, "data.micro_batch_size_per_gpu", micro)
    if data.train_batch_size > 0 and micro > 0 and data.train_batch_size % (micro * world_size):
        problems.append(f"data.train_batch_size={data.train_batch_size} is not divisible by "
                        f"{micro} sequences per micro-batch x {world_size} data-parallel workers "
                        "(data.micro_batch_size_per_gpu, or data.micro_batch_size / workers)")


def validate_sft_config(cfg: Any, *, world_size: int = 1, model_max_len: int | None = None,
                        check_paths: bool = True) -> None:
    """Raise ConfigError listing every problem of a resolved SFTConfig."""
    problems: list[str] = []
    if check_paths:
        _check_model_path(problems, "model.partial_pretrain", sft_model_path(cfg))
        _check_files(problems, "data.train_files", cfg.data.train_files)
        _check_files(problems, "data.val_files", cfg.data.val_files)
    data = cfg.data
    _check_sft_batch_sizes(problems, data, sft_data_parallel_size(cfg, world_size))
    _check_choice(problems, "data.truncation", data.truncation, ("error", "left", "right"))
    _check_strategies(problems, {"model.strategy": cfg.model.strategy})
    if data.pad_mode is not None:
        _check_choice(problems, "data.pad_mode", data.pad_mode, ("no_padding", "right"))
    _check_choice(problems, "optim.lr_scheduler", cfg.optim.lr_scheduler, LR_SCHEDULES)
    problems += optim_problems("optim", cfg.optim)
    if model_max_len is not None and data.max_length > model_max_len:
        problems.append(f"data.max_length={data.max_length} exceeds the model's context of {model_max_len} tokens")
    _check_choice(problems, "trainer.resume_mode", cfg.trainer.resume_mode, RESUME_MODES)
    _check_output_folder(problems, "trainer.default_local_dir", cfg.trainer.default_local_dir)
    _check_sp_size(problems, "ulysses_sequence_parallel_size", cfg.ulysses_sequence_parallel_size, world_size,
                   packed=sft_packed(cfg), packing_key="use_remove_padding",
                   ranks_name="torchrun's processes")
    raise_if_problems(problems)

"""Cross-field checks that run before any model is loaded.

Each problem is one line that names the keys involved and the fix; all problems found
are reported together. Checks that need a registry (advantage estimator names, policy
losses, rollout backends, trackers) live with those registries and are run by the
trainer at start-up, also before any model loads.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
from typing import Any

from hybridflow.algos.registry import AdvantageSpec, UnknownAlgorithmError, advantage_spec
from hybridflow.config.distillation import distillation_problems  # issue 60
from hybridflow.config.loader import MEGATRON
from hybridflow.config.sft import sft_packed
from hybridflow.config.verl_versions import warn_version_differences
from hybridflow.errors import ConfigError

logger = logging.getLogger(__name__)
TRUNCATION_MODES = ("error", "left", "right", "middle")
RESUME_MODES = ("auto", "disable", "resume_path")
KL_CTRL_TYPES = ("fixed", "adaptive")
LR_SCHEDULES = ("constant", "cosine")
DEVICES = ("auto", "cpu", "cuda")


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


def _check_choice(problems: list[str], key: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        problems.append(f"{key}={value!r} is not one of {', '.join(choices)}")


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


def _check_positive(problems: list[str], key: str, value: Any) -> None:
    if value is not None and value <= 0:
        problems.append(f"{key}={value} must be a positive integer")


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


SERVER_ENGINES = ("vllm", "sglang")
"""verl's fully async YAML turns partial_rollout on with these; here they cannot pause, so it is off, said once."""


def partial_rollout_blocker(cfg: Any) -> str | None:
    """Why ``async_training.partial_rollout`` cannot act in this run, or None where it can (the native engine,
    single-turn, in this process or in a rollout pool of its own)."""
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.name != "native" or rollout.multi_turn.enable:
        return f"the {rollout.name} engine{' in multi-turn' if rollout.multi_turn.enable else ''} cannot pause"
    if cfg.trainer.backend != "local" and not split_placement(cfg):
        return "on Ray only a rollout pool of its own (rollout.n_gpus_per_node > 0) takes a sync mid-generate"
    return None


def partial_rollout_problems(cfg: Any) -> list[str]:
    """``partial_rollout=True`` where it cannot act is refused before anything loads, except with vLLM / SGLang:
    verl's fully async recipes turn it on with them (its YAML's default), so there it is off with a warning."""
    blocker = partial_rollout_blocker(cfg) if cfg.async_training.partial_rollout else None
    if blocker is None or cfg.actor_rollout_ref.rollout.name in SERVER_ENGINES:
        return []
    return [f"async_training.partial_rollout=True cannot act here ({blocker}): use rollout.name=native single-turn "
            "(on Ray with rollout.n_gpus_per_node > 0), or set async_training.partial_rollout=False"]


def partial_rollouts(cfg: Any) -> bool:
    """``async_training.partial_rollout`` where it can act: the native engine pauses single-turn sequences at a
    weight sync, in this process or in a rollout pool of its own. With vLLM / SGLang (verl's async recipes turn it
    on by default) it warns once and in-flight sequences finish with the weights they started with; elsewhere
    :func:`partial_rollout_problems` refused it before loading."""
    if not cfg.async_training.partial_rollout:
        return False
    reason = partial_rollout_blocker(cfg)
    if reason is None:
        return True
    if reason not in _PARTIAL_WARNED:
        _PARTIAL_WARNED.add(reason)
        logger.warning("hybridflow: warning: async_training.partial_rollout=True has no effect here (%s): sequences in "
                       "flight at a weight sync finish with the weights they started with (native single-turn "
                       "engine needed)", reason)
    return False


_PARTIAL_WARNED: set[str] = set()


def _check_algorithm(problems: list[str], cfg: Any) -> None:
    algo, actor = cfg.algorithm, cfg.actor_rollout_ref.actor
    if estimator_spec(algo.adv_estimator).needs_values and cfg.critic.enable is False:
        problems.append(f"algorithm.adv_estimator={algo.adv_estimator} needs a critic but critic.enable=False: "
                        "enable the critic or pick a critic-free estimator such as grpo")
    if critic_enabled(cfg) and cfg.critic.model.path in (None, ""):
        problems.append(f"critic.model.path is not set (it is needed because adv_estimator={algo.adv_estimator})")
    _check_choice(problems, "algorithm.kl_ctrl.type", algo.kl_ctrl.type, KL_CTRL_TYPES)
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


SANDBOX_MIN_MEMORY_MB = 24
"""The smallest address-space limit under which the sandbox's Python starts, with a margin (measured with the
harness under ``python -I -S``: ``print(sum(range(10)))`` runs at 16 MB, at 12 MB the imports raise MemoryError):
below it every code sample would score 0."""


def _check_sandbox(problems: list[str], sandbox: Any) -> None:
    if sandbox.memory_limit_mb < SANDBOX_MIN_MEMORY_MB:
        problems.append(f"reward_model.sandbox_fusion.memory_limit_mb={sandbox.memory_limit_mb} is too small for a "
                        f"Python program to start (at least {SANDBOX_MIN_MEMORY_MB}; the default is 1024): every code "
                        "sample would score 0")


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
    """The native engine's step budget: positive, and with chunked prefill above the decode rows it must hold."""
    key = "actor_rollout_ref.rollout.max_num_batched_tokens"
    _check_positive(problems, key, rollout.max_num_batched_tokens)
    if (rollout.name == "native" and rollout.enable_chunked_prefill and isinstance(rollout.max_num_batched_tokens, int)
            and 0 < rollout.max_num_batched_tokens <= rollout.max_num_seqs):
        problems.append(f"{key}={rollout.max_num_batched_tokens} must exceed actor_rollout_ref.rollout.max_num_seqs="
                        f"{rollout.max_num_seqs} with chunked prefill (a live row decodes one token a step, prefill "
                        "takes what is left): raise it, lower max_num_seqs, or set rollout.enable_chunked_prefill=False")


def _check_optimizer_class(problems: list[str], key: str, optim: Any) -> None:
    """``optim.optimizer`` must name a class in an importable ``optim.optimizer_impl`` (issue 60)."""
    impl, name = getattr(optim, "optimizer_impl", "torch.optim"), getattr(optim, "optimizer", "AdamW")
    try:
        module = importlib.import_module(impl)
    except ImportError:
        problems.append(f"{key}.optimizer_impl={impl!r} cannot be imported: install it or use torch.optim")
        return
    if not isinstance(getattr(module, name, None), type):
        problems.append(f"{key}.optimizer={name!r} is not a class in {impl} (e.g. AdamW, SGD)")


def _check_optim(problems: list[str], key: str, optim: Any) -> None:
    """AdamW and schedule settings that torch would only reject after the model has loaded (a NaN or infinite
    learning rate it takes silently, and every weight becomes NaN at the first step)."""
    if not 0 <= optim.lr < math.inf:
        problems.append(f"{key}.lr={optim.lr} must be a finite number >= 0 (a typical RL learning rate is 1e-6)")
    if optim.eps < 0:
        problems.append(f"{key}.eps={optim.eps} must be >= 0 (AdamW's default is 1e-8)")
    if optim.weight_decay < 0:
        problems.append(f"{key}.weight_decay={optim.weight_decay} must be >= 0")
    _check_optimizer_class(problems, key, optim)
    betas = list(optim.betas)
    if len(betas) != 2 or not all(0 <= beta < 1 for beta in betas):
        problems.append(f"{key}.betas={betas} must be two numbers in [0, 1), e.g. [0.9, 0.999]")
    for name in ("lr_warmup_steps_ratio", "warmup_steps_ratio", "min_lr_ratio"):
        value = getattr(optim, name, None)
        if value is not None and not 0 <= value <= 1:
            problems.append(f"{key}.{name}={value} must be in [0, 1]")
    if getattr(optim, "num_cycles", 0) < 0:
        problems.append(f"{key}.num_cycles={optim.num_cycles} must be >= 0")
    if getattr(optim, "clip_grad", 1.0) <= 0:
        problems.append(f"{key}.clip_grad={optim.clip_grad} must be > 0")
    for name in ("lr_scheduler_type", "warmup_style"):
        value = getattr(optim, name, None)
        if value is not None and value not in LR_SCHEDULES:
            problems.append(f"{key}.{name}={value!r} is not one of {', '.join(LR_SCHEDULES)}")


def _check_verl_versions(problems: list[str], cfg: Any) -> None:
    """Keys whose meaning changed between verl versions (``config/verl_versions.py``): a conflict is a problem,
    the rest is said once."""
    try:
        warn_version_differences(cfg, with_critic=critic_enabled(cfg))
    except ConfigError as err:
        problems.append(str(err))


def _check_multi_turn(problems: list[str], multi_turn: Any) -> None:
    key = "actor_rollout_ref.rollout.multi_turn"
    _check_choice(problems, f"{key}.tool_response_truncate_side", multi_turn.tool_response_truncate_side,
                  ("left", "right", "middle"))
    _check_choice(problems, f"{key}.tokenization_sanity_check_mode", multi_turn.tokenization_sanity_check_mode,
                  ("strict", "ignore_strippable", "disable"))
    _check_positive(problems, f"{key}.max_parallel_calls", multi_turn.max_parallel_calls)
    _check_positive(problems, f"{key}.max_tool_response_length", multi_turn.max_tool_response_length)
    if multi_turn.use_inference_chat_template:
        problems.append(f"{key}.use_inference_chat_template=True is not supported: the context keeps the generated "
                        "ids as generated; set it to False")
    for name in ("tool_config_path", "interaction_config_path"):
        path = getattr(multi_turn, name)
        if path and not os.path.isfile(os.path.expanduser(str(path))):
            problems.append(f"{key}.{name}: file '{path}' does not exist")
    if (multi_turn.tool_config_path or multi_turn.interaction_config_path) and not multi_turn.enable:
        problems.append(f"{key}.tool_config_path / interaction_config_path are set but {key}.enable=False: "
                        "set enable=True to run the tool agent")


def _check_trainer(problems: list[str], trainer: Any) -> None:
    _check_choice(problems, "trainer.resume_mode", trainer.resume_mode, RESUME_MODES)
    _check_choice(problems, "trainer.device", trainer.device, DEVICES)
    _check_choice(problems, "trainer.backend", trainer.backend, ("local", "ray"))
    if trainer.resume_mode == "resume_path" and not trainer.resume_from_path:
        problems.append("trainer.resume_mode=resume_path needs trainer.resume_from_path=.../global_step_N")
    _check_output_folder(problems, "trainer.default_local_dir", trainer.default_local_dir)
    if trainer.total_training_steps is not None:
        _check_positive(problems, "trainer.total_training_steps", trainer.total_training_steps)
    _check_positive(problems, "trainer.total_epochs", trainer.total_epochs)


def _check_output_folder(problems: list[str], key: str, path: str) -> None:
    """A folder the run writes into (checkpoints, logs) cannot be, or lie under, a regular file: said before any
    model loads, not as a NotADirectoryError when the first log or checkpoint is written."""
    full = os.path.abspath(os.path.expanduser(str(path)))
    existing = full
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        where = "is a file" if existing == full else f"lies under the file '{existing}'"
        problems.append(f"{key}='{path}' {where}, not a folder: point it at a folder (the run writes its "
                        "global_step_N checkpoints and logs there)")


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
    _check_multi_turn(problems, cfg.actor_rollout_ref.rollout.multi_turn)
    _check_trainer(problems, cfg.trainer)
    _check_split_placement(problems, cfg)
    _check_best_checkpoint(problems, cfg)
    _check_sandbox(problems, cfg.reward_model.sandbox_fusion)
    _check_optim(problems, "actor_rollout_ref.actor.optim", cfg.actor_rollout_ref.actor.optim)
    if critic_enabled(cfg):
        _check_optim(problems, "critic.optim", cfg.critic.optim)
    if implicit_prm_enabled(cfg):
        _check_optim(problems, "reward_model.model.optim", cfg.reward_model.model.optim)
    _check_verl_versions(problems, cfg)
    problems.extend(distillation_problems(cfg, check_paths=check_paths))  # issue 60
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
    _check_optim(problems, "optim", cfg.optim)
    if model_max_len is not None and data.max_length > model_max_len:
        problems.append(f"data.max_length={data.max_length} exceeds the model's context of {model_max_len} tokens")
    _check_choice(problems, "trainer.resume_mode", cfg.trainer.resume_mode, RESUME_MODES)
    _check_output_folder(problems, "trainer.default_local_dir", cfg.trainer.default_local_dir)
    _check_sp_size(problems, "ulysses_sequence_parallel_size", cfg.ulysses_sequence_parallel_size, world_size,
                   packed=sft_packed(cfg), packing_key="use_remove_padding",
                   ranks_name="torchrun's processes")
    raise_if_problems(problems)

"""``python -m hybridflow.trainer.main_ppo key=value ...``: build the PPO workers from a config and train.

Order matters for the user: everything that can be checked without loading a model
(keys, types, batch arithmetic, files, registered names, the model's context length
from its config.json) is checked first, so a typo costs a second, not a model load.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from hybridflow.algos import (advantage_spec, get_advantage, get_policy_loss, list_kl_penalties, list_loss_agg_modes,
                             policy_loss_spec)
from hybridflow.algos.errors import AlgorithmError, UnknownAlgorithmError
from hybridflow.algos.pf_ppo import PF_PPO_METHODS
from hybridflow.algos.policy_losses.bypass import BYPASS_LOSS_TYPES
from hybridflow.algos.rollout_correction.is_weights import IS_LEVELS
from hybridflow.algos.rollout_correction.rejection import parse_options
from hybridflow.algos.rollout_correction.thresholds import parse_bounds, parse_rs_thresholds
from hybridflow.config import (PPOConfig, config_value, critic_enabled, implicit_prm_enabled, reference_enabled,
                               split_placement, validate_ppo_config)
from hybridflow.config.loader import run_from_config_args
from hybridflow.config.validate import as_list, partial_rollouts
from hybridflow.controller.resources import ResourcePool, pool_from_trainer_config
from hybridflow.controller.worker_group import build_worker_group
from hybridflow.data.dataloader import StatefulDataLoader
from hybridflow.data.rl_dataset import RLDataset
from hybridflow.errors import ConfigError, run_entry_point
from hybridflow.models import load_causal_lm, load_reward_model, load_tokenizer
from hybridflow.models import load_config as load_model_config
from hybridflow.models.loader import import_external_lib
from hybridflow.rewards import RewardModelScorer, build_reward_manager, load_reward_function
from hybridflow.rewards.code_sandbox import apply_sandbox_settings
from hybridflow.rewards.generative_judge import DEFAULT_TEMPLATE, GenerativeJudge
from hybridflow.rewards.registry import check_rows_scorable
from hybridflow.rollout import SamplingParams
from hybridflow.rollout.engine import build_engine, engine_unavailable
from hybridflow.trainer.best_checkpoint import read_best_record
from hybridflow.trainer.entry import model_context_length, resolve_device, seed_everything
from hybridflow.trainer.plots import plot_curves
from hybridflow.trainer.ppo import PPOTrainer, PPOWorkers
from hybridflow.trainer.ppo_builders import (build_critic_worker, build_hybrid_engine, build_rollout_worker,
                                             policy_processor, policy_tokenizer)
from hybridflow.trainer.prime_role import build_prm_group, implicit_prm_problems
from hybridflow.trainer.ppo_roles import CriticGroupWorker, GroupCheckpoint, HybridEngineWorker, RolloutGroupWorker
from hybridflow.trainer.reward_config import reward_manager_kwargs, reward_manager_problems
from hybridflow.trainer.summary import summary_table
from hybridflow.trainer.tracking import Tracking, available_backends
from hybridflow.workers.reward import RewardWorker

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


def engine_and_logger_problems(cfg) -> list[str]:
    """Registered names every trainer that generates reads: the rollout engine and the trackers."""
    engine_problem = engine_unavailable(cfg.actor_rollout_ref.rollout.name)
    problems = [f"actor_rollout_ref.{engine_problem}"] if engine_problem else []
    for name in as_list(cfg.trainer.logger):
        if name not in available_backends():
            problems.append(f"trainer.logger: unknown backend {name!r}; choose from {', '.join(available_backends())}")
    return problems


def check_algorithm_settings(cfg: PPOConfig) -> None:
    """Settings the chosen estimator / loss / correction needs, checked before any model is loaded."""
    algo, actor = cfg.algorithm, cfg.actor_rollout_ref.actor
    corr, rollout = algo.rollout_correction, cfg.actor_rollout_ref.rollout
    problems = spec_problems(cfg, lambda: advantage_spec(algo.adv_estimator))
    if implicit_prm_enabled(cfg):
        problems += implicit_prm_problems(cfg)
    problems += spec_problems(cfg, lambda: policy_loss_spec(actor.policy_loss.loss_mode))
    if algo.use_pf_ppo and algo.pf_ppo.reweight_method not in PF_PPO_METHODS:
        problems.append(f"algorithm.pf_ppo.reweight_method={algo.pf_ppo.reweight_method!r}: use one of "
                        f"{', '.join(PF_PPO_METHODS)}")
    if corr.rollout_is is not None and corr.rollout_is not in IS_LEVELS:
        problems.append(f"algorithm.rollout_correction.rollout_is={corr.rollout_is!r}: use token, sequence or null")
    if corr.bypass_mode and corr.loss_type not in BYPASS_LOSS_TYPES:
        problems.append(f"algorithm.rollout_correction.loss_type={corr.loss_type!r}: use ppo_clip or reinforce")
    if corr.bypass_mode and actor.policy_loss.loss_mode != "vanilla":
        problems.append("algorithm.rollout_correction.bypass_mode=True replaces the policy loss (loss_type=ppo_clip is "
                        f"vanilla PPO, or reinforce); leave policy_loss.loss_mode=vanilla, not "
                        f"{actor.policy_loss.loss_mode!r}")
    if corr.bypass_mode and (rollout.top_p < 1 or rollout.top_k > 0):
        problems.append("algorithm.rollout_correction.bypass_mode=True needs rollout.top_p=1 and rollout.top_k=-1: "
                        "the engine's log-probs are of the filtered distribution, the trainer's are not")
    try:
        parse_bounds(corr.rollout_is_threshold, what="algorithm.rollout_correction.rollout_is_threshold")
        if corr.rollout_rs is not None:
            parse_rs_thresholds(options=parse_options(corr.rollout_rs), spec=corr.rollout_rs_threshold)
    except AlgorithmError as err:
        problems.append(str(err))
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
                  model.path, model.trust_remote_code, dict(model.override_config))))
    problems = []
    for check in checks:
        try:
            check()
        except ConfigError as err:
            problems += str(err).splitlines()
    if problems:
        raise ConfigError("\n".join(problems))
    warn_about_ignored_gpus(cfg)


# ------------------------------------------------------------------ building the parts
def build_datasets(cfg: PPOConfig, tokenizer):
    """(train loader, val loader or None) over verl-schema parquet/jsonl files."""
    data = cfg.data
    processor = policy_processor(cfg, tokenizer)  # a vision-language policy's: rows carry images

    def dataset(files, max_samples):
        return RLDataset(files, tokenizer=tokenizer, prompt_key=data.prompt_key, max_prompt_length=data.max_prompt_length,
                         processor=processor, image_key=data.image_key,
                         filter_overlong_prompts=data.filter_overlong_prompts, truncation=data.truncation,
                         max_samples=max_samples, apply_chat_template_kwargs=dict(data.apply_chat_template_kwargs),
                         return_raw_chat=data.return_raw_chat or cfg.reward_model.enable
                         or cfg.actor_rollout_ref.rollout.multi_turn.enable)

    max_train = data.train_max_samples if data.train_max_samples > 0 else data.max_samples
    train = dataset(data.train_files, max_train)
    train_loader = StatefulDataLoader(train, batch_size=data.gen_batch_size or data.train_batch_size,
                                      collate_fn=train.collate_fn,
                                      shuffle=data.shuffle, seed=data.seed, drop_last=True)
    if not data.val_files:
        return train_loader, None
    val = dataset(data.val_files, data.val_max_samples)
    val_loader = StatefulDataLoader(val, batch_size=data.val_batch_size or len(val), collate_fn=val.collate_fn,
                                    shuffle=data.validation_shuffle, seed=data.seed, drop_last=False)
    return train_loader, val_loader


def total_training_steps(cfg: PPOConfig, steps_per_epoch: int) -> int:
    steps = steps_per_epoch * cfg.trainer.total_epochs
    if cfg.trainer.total_training_steps is not None:
        steps = cfg.trainer.total_training_steps
    return steps


def build_worker_groups(cfg: PPOConfig, *, total_steps: int):
    """(actor/reference group, rollout group, critic group or None, implicit PRM group or None) on ``trainer.backend``.

    The actor, rollout and reference share one group (the hybrid engine) unless ``rollout.n_gpus_per_node``
    places the rollout in its own pool (split placement); ``local`` runs the group in this process at world
    size 1, ``ray`` as ``nnodes x n_gpus_per_node`` FSDP2 ranks.
    """
    built: list = []
    try:
        return _build_groups(cfg, total_steps=total_steps, built=built)
    except BaseException:
        for group in built:  # a group that cannot be placed must not leave the others holding the cluster
            group.shutdown()
        raise


def _build_groups(cfg: PPOConfig, *, total_steps: int, built: list):
    backend, kwargs = cfg.trainer.backend, ray_group_kwargs(cfg)
    split = split_placement(cfg)
    # On Ray the training groups share each bundle of the actor's placement group: half each with a critic.
    colocated = {"share": 1.0 / (1 + critic_enabled(cfg) + implicit_prm_enabled(cfg))} if backend == "ray" else {}
    engine = build_worker_group(functools.partial(build_hybrid_engine, cfg=cfg, total_steps=total_steps,
                                                  with_rollout=not split),
                                worker_cls=HybridEngineWorker, backend=backend, name="actor_rollout_ref",
                                ranks_per_shard=cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size,
                                **kwargs, **colocated)
    built.append(engine)
    rollout = engine
    if split:
        pool = ResourcePool(nnodes=cfg.rollout.nnodes, procs_per_node=cfg.rollout.n_gpus_per_node,
                            cpus_per_proc=kwargs["pool"].cpus_per_proc, gpus_per_proc=kwargs["pool"].gpus_per_proc)
        # Partial rollouts: a rollout actor takes the weight sync in a second thread while its generate runs.
        concurrency = 2 if partial_rollouts(cfg) else 1
        rollout = build_worker_group(functools.partial(build_rollout_worker, cfg=cfg), worker_cls=RolloutGroupWorker,
                                     backend=backend, name="rollout", **dict(kwargs, pool=pool, concurrency=concurrency))
        built.append(rollout)
    critic = prm = None
    if backend == "ray":  # colocated with the actor: a share of each of its bundles
        kwargs = dict(kwargs, placement_group=engine.backend.placement_group, **colocated)
    if critic_enabled(cfg):
        critic = build_worker_group(functools.partial(build_critic_worker, cfg=cfg, total_steps=total_steps),
                                    worker_cls=CriticGroupWorker, backend=backend, name="critic",
                                    ranks_per_shard=cfg.critic.ulysses_sequence_parallel_size, **kwargs)
        built.append(critic)
    if implicit_prm_enabled(cfg):
        prm = build_prm_group(cfg, total_steps=total_steps, group_kwargs=dict(kwargs, backend=backend))
    return engine, rollout, critic, prm


def ray_group_kwargs(cfg: PPOConfig) -> dict[str, Any]:
    """Resource pool and cluster address of the Ray backend (nothing for ``local``)."""
    if cfg.trainer.backend != "ray":
        return {}

    ray_init = cfg.ray_kwargs.ray_init
    pool = pool_from_trainer_config(cfg.trainer, use_gpu=resolve_device(cfg.trainer.device).type == "cuda",
                                    cpus_per_proc=cfg.ray_kwargs.cpus_per_worker)
    return {"pool": pool, "ray_address": ray_init.address, "ray_num_cpus": ray_init.num_cpus,
            "ray_runtime_env": dict(ray_init.runtime_env),
            "timeout_s": float(cfg.trainer.ray_wait_register_center_timeout)}


def stop_token_ids(path: str, tokenizer) -> list[int]:
    """EOS of the tokenizer plus the model's generation-config EOS ids (chat models often have several)."""
    from transformers import GenerationConfig

    ids = {tokenizer.eos_token_id}
    try:
        eos = GenerationConfig.from_pretrained(os.path.expanduser(path)).eos_token_id
    except OSError:
        eos = None
    ids.update(eos if isinstance(eos, list) else [eos])
    return sorted(i for i in ids if i is not None)


def build_reward_worker(cfg: PPOConfig, tokenizer):
    """The configured manager around the built-in scorers or ``custom_reward_function``."""
    rm = cfg.reward_model
    compute_score = None
    if cfg.custom_reward_function.path:
        compute_score = load_reward_function(cfg.custom_reward_function.path, cfg.custom_reward_function.name)
    manager = build_reward_manager(rm.reward_manager, compute_score=compute_score, **reward_manager_kwargs(cfg))
    model_scorer = None
    if rm.enable:
        model_scorer = build_generative_judge(cfg) if uses_generative_judge(cfg) else build_reward_model_scorer(cfg)
    return RewardWorker(manager=manager, tokenizer=tokenizer, reward_fn_key=cfg.data.reward_fn_key,
                        model_scorer=model_scorer,
                        stop_when_all_fail=rm.stop_when_all_fail)


def check_reward_inputs(cfg: PPOConfig, loaders: dict[str, Any]) -> None:
    """Before any model loads: every row's data_source has a built-in scorer that can run here.

    Skipped for a custom reward function or a reward model (they decide what they need).
    """
    sandbox = cfg.reward_model.sandbox_fusion
    apply_sandbox_settings(allow_unsandboxed=sandbox.allow_unsandboxed, timeout_s=sandbox.timeout_s,
                           memory_mb=sandbox.memory_limit_mb)
    if cfg.custom_reward_function.path or cfg.reward_model.enable:
        return
    for files_key, loader in loaders.items():
        if hasattr(getattr(loader, "dataset", None), "reward_inputs"):  # a data.custom_cls may not have it
            check_rows_scorable(loader.dataset.reward_inputs(cfg.data.reward_fn_key), files=files_key,
                                reward_kwargs=dict(cfg.custom_reward_function.reward_kwargs))


def uses_generative_judge(cfg: PPOConfig) -> bool:
    """``reward_model.use_reward_loop`` with a causal-LM model is a generative judge; a sequence
    classifier is scored directly (verl's reward loop serves both kinds)."""
    rm = cfg.reward_model
    if not (rm.use_reward_loop and rm.model.path):
        return False
    config = load_model_config(rm.model.path, trust_remote_code=rm.model.trust_remote_code)  # a bad path or type: one line
    return not any(name.endswith("ForSequenceClassification") for name in (config.architectures or []))


def build_generative_judge(cfg: PPOConfig):
    """``reward_model.use_reward_loop``: a causal-LM judge generating verdicts through ``reward_model.rollout``."""
    rm = cfg.reward_model
    if not rm.model.path:
        raise ConfigError("reward_model.use_reward_loop=True needs reward_model.model.path (a causal LM judge)")
    tokenizer = load_tokenizer(rm.model.path, trust_remote_code=rm.model.trust_remote_code)
    model = load_causal_lm(rm.model.path, dtype="float32", trust_remote_code=rm.model.trust_remote_code)
    model = model.to(resolve_device(cfg.trainer.device)).eval()
    engine = build_engine(rm.rollout.name, model, tokenizer, **dict(rm.rollout.engine_kwargs))
    params = SamplingParams(n=1, temperature=rm.rollout.temperature, top_p=rm.rollout.top_p,
                            max_tokens=rm.rollout.response_length, stop_token_ids=stop_token_ids(rm.model.path, tokenizer),
                            seed=cfg.trainer.seed, logprobs=False)
    return GenerativeJudge(engine=engine, tokenizer=tokenizer, sampling_params=params,
                           template=rm.judge.prompt_template or DEFAULT_TEMPLATE, score_pattern=rm.judge.score_pattern,
                           score_scale=rm.judge.score_scale, failure_score=rm.failure_score,
                           timeout_s=rm.judge.timeout_s, max_prompt_length=rm.rollout.prompt_length)


def build_reward_model_scorer(cfg: PPOConfig):
    """A sequence-classification reward model scoring (prompt, response) in its own chat template."""
    rm = cfg.reward_model
    if not rm.model.path:
        raise ConfigError("reward_model.enable=True needs reward_model.model.path (a sequence-classification model)")
    import_external_lib(rm.model.external_lib)
    tokenizer = load_tokenizer(rm.model.path, trust_remote_code=rm.model.trust_remote_code)
    model = load_reward_model(rm.model.path, trust_remote_code=rm.model.trust_remote_code,
                              pad_token_id=tokenizer.pad_token_id)
    return RewardModelScorer(model=model, tokenizer=tokenizer, max_length=rm.max_length,
                             micro_batch_size=rm.micro_batch_size_per_gpu or rm.micro_batch_size or 8)


def build_trainer(cfg: PPOConfig, *, trainer_class=PPOTrainer, count_steps=total_training_steps) -> PPOTrainer:
    """Everything the loop needs, from a validated config (the async entry points pass their trainer)."""
    seed_everything(cfg.trainer.seed)
    device = resolve_device(cfg.trainer.device)
    tokenizer = policy_tokenizer(cfg)
    train_loader, val_loader = build_datasets(cfg, tokenizer)
    check_reward_inputs(cfg, {"data.train_files": train_loader, "data.val_files": val_loader})
    total_steps = count_steps(cfg, len(train_loader))
    engine, rollout, critic, prm = build_worker_groups(cfg, total_steps=total_steps)
    workers = PPOWorkers(actor=engine, rollout=rollout, reward=build_reward_worker(cfg, tokenizer),
                         reference=engine if reference_enabled(cfg) else None, critic=critic, implicit_prm=prm)
    # the PRM under "reward", the recipe's folder name
    components = {"actor": GroupCheckpoint(engine), **({"critic": GroupCheckpoint(critic)} if critic else {}),
                  **({"reward": GroupCheckpoint(prm)} if prm else {})}
    return trainer_class(cfg=cfg, workers=workers, train_loader=train_loader, val_loader=val_loader,
                      tracking=build_tracking(cfg),
                      tokenizer=tokenizer, total_steps=total_steps, device=device, checkpoint_components=components,
                      stop_token_ids=stop_token_ids(cfg.actor_rollout_ref.model.path, tokenizer))


def build_tracking(cfg):
    """The trackers of ``trainer.logger``, recording the resolved config; file backends write under logs/."""


    return Tracking(cfg.trainer.project_name, cfg.trainer.experiment_name, as_list(cfg.trainer.logger),
                    config=OmegaConf.to_container(OmegaConf.structured(cfg)),
                    local_dir=os.path.join(cfg.trainer.default_local_dir, "logs"))


@dataclass
class PPORun:
    """What a finished run leaves: per-step metrics, the last step's metrics and the plot files."""

    history: list[dict[str, float]]
    last: dict[str, float]
    steps: int
    plots: list[str]
    resumed_from: int = 0  # the checkpoint's step this process started from (0: a fresh run)


def run_ppo(cfg: PPOConfig, **build_kwargs) -> PPORun:
    """Validate, build, train; print the summary and write the plots."""
    preflight(cfg)
    return train_and_report(build_trainer(cfg, **build_kwargs), cfg)


def train_and_report(trainer, cfg) -> PPORun:
    """Run a built trainer to the end; print the summary and write the plots (every RL trainer's ending)."""
    try:
        last = trainer.fit()
    finally:
        trainer.close()
    history = trainer.tracking.history
    print(summary_table(history))
    if cfg.trainer.keep_best_checkpoint or cfg.trainer.early_stop_patience > 0:
        print(trainer.best.describe() + _best_folder(cfg.trainer.default_local_dir))
    plots = plot_curves(history, os.path.join(cfg.trainer.default_local_dir, "plots"))
    return PPORun(history=history, last=last, steps=trainer.global_step, plots=plots,
                  resumed_from=trainer.resumed_from)


def _best_folder(root: str) -> str:
    record = read_best_record(root)
    return f" (kept at {record.path})" if record is not None else ""


USAGE_SUMMARY = "PPO / GRPO / DAPO / ... training with verl's main_ppo keys (also: hybridflow ppo)."


def run_from_args(args: list[str], *, prog: str = "python -m hybridflow.trainer.main_ppo",
                  summary: str = USAGE_SUMMARY, defaults: tuple[str, ...] = (), adapt=None) -> int:
    """``[--config-path D --config-name N] key=value ...`` -> a run (shared by ``hybridflow ppo`` and the recipes'
    entry points, which pass their ``defaults`` and ``adapt``: see ``run_from_config_args``)."""
    return run_from_config_args(args, schema=PPOConfig, run=run_ppo, trainer="ppo", prog=prog, summary=summary,
                                defaults=defaults, adapt=adapt)


def main(argv: list[str] | None = None) -> int:
    return run_entry_point(run_from_args, list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())

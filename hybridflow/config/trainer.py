"""verl's ``trainer.*``, ``ray_kwargs.*`` and the async trainers' sections: the run, its logging, checkpoints and placement.

Part of the PPO trainer's schema (:class:`hybridflow.config.ppo.PPOConfig`); each field's docstring is its
documentation, and ``ppo_trainer.yaml`` is generated from them.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from hybridflow.config.checks import check_choice, check_output_folder, check_positive


@dataclass
class TrainerConfig:
    """The loop, logging and checkpoints (verl's ``trainer.*``)."""

    balance_batch: bool = True
    """Equalise tokens per data-parallel rank (Karmarkar-Karp partitioning)."""
    total_epochs: int = 30
    """Passes over the training set."""
    total_training_steps: Optional[int] = None
    """Stop after this many steps (overrides total_epochs when smaller)."""
    project_name: str = "hybridflow"
    """Tracker project name."""
    experiment_name: str = "run"
    """Tracker run name."""
    logger: Any = field(default_factory=lambda: ["console"])
    """Trackers: any of console, file, tensorboard, wandb, swanlab, mlflow."""
    log_val_generations: int = 0
    """Validation samples (prompt, response, score) to log as text."""
    # verl scripts add it with Hydra's ``+`` (verl itself reads the TENSORBOARD_DIR environment variable)
    tensorboard_dir: Optional[str] = None
    """Where the tensorboard backend writes its event files; null: $TENSORBOARD_DIR when set (verl's variable), else
    {default_local_dir}/logs/tensorboard."""
    rollout_data_dir: Optional[str] = None
    """Dump every rollout (prompt, response, score) as JSONL here."""
    validation_data_dir: Optional[str] = None
    """Dump validation generations as JSONL here."""
    nnodes: int = 1
    """Nodes in the Ray cluster."""
    n_gpus_per_node: int = 1
    """GPUs per node (on a CPU run: worker processes per node)."""
    save_freq: int = -1
    """Checkpoint every N steps (-1 = only never; the final step is saved when > 0)."""
    resume_mode: str = "auto"
    """``auto`` (latest checkpoint if any), ``disable``, or ``resume_path``."""
    resume_from_path: Optional[str] = None
    """global_step_N folder to resume from when resume_mode=resume_path."""
    start_over: bool = False
    """Delete the checkpoints in default_local_dir and start a fresh run there. Without it, a folder whose
    checkpoints were made under another configuration (other components, adv_estimator or model path), or
    any checkpoint with resume_mode=disable, is refused with one line and left untouched."""
    val_before_train: bool = True
    """Validate once before the first step."""
    val_only: bool = False
    """Validate and exit."""
    test_freq: int = -1
    """Validate every N steps (-1 = never)."""
    critic_warmup: int = 0
    """Steps during which only the critic is updated."""
    default_hdfs_dir: Optional[str] = None
    """Compatibility-only, no effect (see compat.py)."""
    del_local_ckpt_after_load: bool = False
    """Compatibility-only (compat.py); in verl: delete the local checkpoint after loading it."""
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    """Checkpoint root: global_step_N/{actor,critic} and latest_checkpointed_iteration.txt."""
    max_actor_ckpt_to_keep: Optional[int] = None
    """Keep only the newest N actor checkpoints (null = all)."""
    max_critic_ckpt_to_keep: Optional[int] = None
    """Keep only the newest N critic checkpoints (null = all)."""
    keep_best_checkpoint: bool = False
    """Save a checkpoint at every validation that sets a new best ``best_metric`` and never rotate it away;
    ``best_checkpoint.json`` in default_local_dir names its step, score and folder. Needs validation
    (``data.val_files`` and ``test_freq`` > 0)."""
    best_metric: Optional[str] = None
    """The validation metric (higher is better) that picks the best checkpoint and drives early stopping,
    e.g. ``val-core/openai/gsm8k/reward/mean@1``; null = the mean of the run's ``val-core/`` metrics."""
    early_stop_patience: int = 0
    """Stop after this many validations in a row without a new best ``best_metric`` (0 = never). The
    final step is then checkpointed as the last one would be."""
    stop_on_checkpoint_error: bool = True
    """Stop the run when a checkpoint cannot be written (disk full, I/O error); the partial step is removed and
    earlier checkpoints stay intact. false logs one warning and keeps training (the next save tries again)."""
    ray_wait_register_center_timeout: int = 300
    """Seconds to wait for Ray workers to register."""
    device: str = "auto"
    """``auto`` (cuda when available, else cpu), ``cpu`` or ``cuda``."""
    seed: int = 42
    """Global seed (model init of heads, dropout, sampling)."""
    backend: str = "auto"
    """Worker-group backend: ``local`` (in-process), ``ray``, or ``auto``: ray when the rollout has a pool of its
    own (``rollout.n_gpus_per_node`` > 0, verl's split placement), else local. Resolved when the config loads."""
    use_legacy_worker_impl: str = "auto"
    """Compatibility-only (compat.py): picks verl's legacy or new worker classes; hybridflow has one."""


@dataclass
class RayInitConfig:
    """Arguments of ``ray.init``."""

    num_cpus: Optional[float] = None
    """CPUs Ray may use; null = all."""
    address: Optional[str] = None
    """An existing cluster's address (``auto`` or host:port); null starts a local one (RAY_ADDRESS also works)."""
    runtime_env: Dict[str, Any] = field(default_factory=dict)
    """``ray.init(runtime_env=...)``: the job's environment (env_vars, py_executable, working_dir, ...), as Ray
    documents it; the worker processes start in it."""
    timeline_json_file: Optional[str] = None
    """Compatibility-only (compat.py); in verl: write a Ray timeline here at the end."""


@dataclass
class RayKwargsConfig:
    """Ray settings (verl's ``ray_kwargs``)."""

    ray_init: RayInitConfig = field(default_factory=RayInitConfig)
    """Arguments of ``ray.init``."""
    cpus_per_worker: float = 1.0
    """CPUs reserved per worker process on a CPU run (fractions let small tests share cores)."""


@dataclass
class AsyncTrainingConfig:
    """Asynchronous training (verl's ``async_training.*``, fully_async_policy and one_step_off_policy recipes),
    read by ``python -m hybridflow.trainer.main_fully_async`` and ``main_one_step_off``; main_ppo ignores it.
    A rollouter thread generates prompt batches into a bounded queue while the trainer consumes them."""

    staleness_threshold: float = 0.0
    """How far the rollouter may run ahead, as a fraction of one sync period's batches: it may have generated at
    most ``(syncs_done + 1 + staleness_threshold) * trigger_parameter_sync_step * require_batches`` batches, so no
    trained batch is more than ``ceil(staleness_threshold)`` weight versions old. 0 = synchronous (bit-for-bit
    the main_ppo loop); 1 with trigger 1 = one-step off-policy."""
    trigger_parameter_sync_step: int = 1
    """Trainer steps between weight syncs to the rollout engine."""
    require_batches: int = 1
    """Prompt batches (data.train_batch_size prompts each) the trainer takes from the queue per step."""
    partial_rollout: bool = False
    """Pause in-flight sequences at a weight sync and continue them with the new weights (each token keeps the
    behaviour log-prob it was sampled with). Native or vLLM engine, single-turn; trainer.backend=local, or ray with
    split placement (rollout.n_gpus_per_node > 0)."""
    use_rollout_log_probs: bool = True
    """Use the engine's per-token behaviour log-probs as the old policy when compute_prox_log_prob is False."""
    compute_prox_log_prob: bool = True
    """Recompute old log-probs with the trainer's current weights (the proximal policy) and correct behaviour ->
    proximal with ``algorithm.rollout_correction`` importance weights; False uses the behaviour log-probs as the
    old policy (needs use_rollout_log_probs)."""
    use_trainer_do_validate: bool = False
    """Compatibility-only (compat.py); in verl: validate in the trainer instead of the rollouter."""
    checkpoint_engine: Dict[str, Any] = field(default_factory=dict)
    """Compatibility-only (compat.py); in verl: the engine that streams weights from trainer to rollouter."""


@dataclass
class AsyncRolloutConfig:
    """The async rollouter's budget (verl's top-level ``rollout.*`` in the fully async recipe)."""

    total_rollout_steps: Optional[int] = None
    """Prompt batches the rollouter generates in the whole run (null = trainer.total_training_steps x
    async_training.require_batches); the trainer runs total_rollout_steps // require_batches steps."""
    total_epochs: Optional[int] = None
    """Passes of the rollouter over the training set when total_rollout_steps is null (null = trainer.total_epochs)."""
    test_freq: Optional[int] = None
    """Validate every N weight syncs (verl's fully async recipe); null = trainer.test_freq steps."""
    nnodes: int = 1
    """Nodes of the rollout pool when the rollout is placed apart from training (split placement)."""
    n_gpus_per_node: int = 0
    """Rollout processes per node in their own pool (verl's split placement of the one-step-off and fully async
    recipes; GPUs on a GPU cluster, processes on CPU); 0 = the rollout runs inside the training processes (the
    hybrid engine). Needs trainer.backend=ray; weights go actor rank 0 -> driver -> every rollout rank."""


RESUME_MODES = ("auto", "disable", "resume_path")
DEVICES = ("auto", "cpu", "cuda")


def trainer_problems(trainer: Any) -> list[str]:
    """The checks of ``trainer.*`` that need no other section."""
    problems: list[str] = []
    check_choice(problems, "trainer.resume_mode", trainer.resume_mode, RESUME_MODES)
    check_choice(problems, "trainer.device", trainer.device, DEVICES)
    check_choice(problems, "trainer.backend", trainer.backend, ("local", "ray"))
    if trainer.resume_mode == "resume_path" and not trainer.resume_from_path:
        problems.append("trainer.resume_mode=resume_path needs trainer.resume_from_path=.../global_step_N")
    check_output_folder(problems, "trainer.default_local_dir", trainer.default_local_dir)
    if trainer.total_training_steps is not None:
        check_positive(problems, "trainer.total_training_steps", trainer.total_training_steps)
    check_positive(problems, "trainer.total_epochs", trainer.total_epochs)
    return problems


def async_training_problems(cfg: Any) -> list[str]:
    """The async trainers' settings (``async_training.*``, the rollouter's ``rollout.*``; main_ppo ignores them):
    one line per unsupported or contradictory one, before anything loads."""
    a, problems = cfg.async_training, []
    if a.staleness_threshold < 0:
        problems.append(f"async_training.staleness_threshold must be >= 0 (got {a.staleness_threshold})")
    if a.trigger_parameter_sync_step < 1:
        problems.append("async_training.trigger_parameter_sync_step must be >= 1")
    if a.require_batches < 1:
        problems.append(f"async_training.require_batches must be >= 1 (got {a.require_batches})")
    if not a.compute_prox_log_prob and not a.use_rollout_log_probs:
        problems.append("async_training: with compute_prox_log_prob=False the old policy is the behaviour one; "
                        "set use_rollout_log_probs=True (or compute_prox_log_prob=True)")
    if cfg.algorithm.filter_groups.enable:
        problems.append("algorithm.filter_groups (DAPO dynamic sampling) is not supported by the async trainers; "
                        "use main_ppo or set algorithm.filter_groups.enable=False")
    steps = cfg.rollout.total_rollout_steps
    if steps is not None and a.require_batches >= 1 and steps < a.require_batches:
        problems.append(f"rollout.total_rollout_steps={steps} is smaller than async_training.require_batches="
                        f"{a.require_batches}: the trainer would run 0 steps; raise total_rollout_steps to at least "
                        "require_batches")
    return problems


def ppo_ranks(cfg: Any) -> int:
    """Ranks of a worker group: 1 on the local backend, else ``nnodes x n_gpus_per_node``."""
    if cfg.trainer.backend == "local":
        return 1
    return cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node


def ppo_world_size(cfg: Any, sp_size: int | None = None) -> int:
    """Data-parallel size of a worker group: its ranks over its sequence-parallel size (default: the actor's)."""
    sp_size = cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size if sp_size is None else sp_size
    return max(1, ppo_ranks(cfg) // sp_size)


def split_placement(cfg: Any) -> bool:
    """The rollout runs in a pool of processes of its own (``rollout.n_gpus_per_node`` > 0), not in the training
    processes (the hybrid engine)."""
    return cfg.rollout.n_gpus_per_node > 0


def check_split_placement(problems: list[str], cfg: Any) -> None:
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


def check_best_checkpoint(problems: list[str], cfg: Any) -> None:
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

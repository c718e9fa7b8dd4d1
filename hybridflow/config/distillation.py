"""verl 0.9.1's ``distillation.*`` section (on-policy distillation): keys, defaults and meanings as in verl's
generated ``ppo_trainer.yaml`` (its ``distillation/distillation.yaml``).

The student (``actor_rollout_ref``) samples; each teacher is a frozen causal LM that scores the student's
prompt + response in the trainer (``hybridflow.workers.teacher``), like the reference policy. verl serves a
teacher with an inference engine in its own resource pool; here it is one more frozen model beside the actor, so
the keys that size that engine or pool are accepted and said to have no effect (``compat.py``).
"""

import os
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from omegaconf import II


@dataclass
class DistillationLossSectionConfig:
    """verl's ``distillation.distillation_loss``: how the teacher's scores become the student's loss
    (``hybridflow.algos.distillation``)."""

    loss_mode: str = "k3"
    """Per-token loss: a reverse-KL estimator of the sampled token (kl/k1, abs, mse/k2, low_var_kl/k3) or
    forward_kl_topk (forward KL over the teacher's top-k tokens)."""
    topk: Optional[int] = 32
    """k of the teacher's top-k log-probs (forward_kl_topk only)."""
    use_task_rewards: bool = True
    """Keep the task's PPO loss (rewards, advantages, entropy and KL terms) and add the distillation loss times
    distillation_loss_coef; false: the distillation loss alone."""
    distillation_loss_coef: float = 1.0
    """Weight of the distillation loss when use_task_rewards is true."""
    loss_max_clamp: Optional[float] = None
    """Clamp the per-token distillation loss to [-c, c]; null: no clamp."""
    log_prob_min_clamp: Optional[float] = None
    """Clamp the top-k log-probs of student and teacher from below (forward_kl_topk); null: no clamp."""
    use_policy_gradient: bool = False
    """Use minus the per-token distillation loss as the advantage of a PPO loss (on-policy distillation as a
    reward; loss_mode=k1 is the usual choice) instead of backpropagating the loss itself."""
    policy_loss_mode: str = "vanilla"
    """The PPO loss of use_policy_gradient (only vanilla, as in verl 0.9.1)."""
    clip_ratio: float = 0.2
    """PPO clip ratio of use_policy_gradient."""
    clip_ratio_low: Optional[float] = 0.2
    """Lower clip ratio of use_policy_gradient."""
    clip_ratio_high: Optional[float] = 0.2
    """Upper clip ratio of use_policy_gradient."""


@dataclass
class TeacherInferenceConfig:
    """verl's ``teacher_models.<name>.inference``: the inference server verl scores with. The teacher here is a
    frozen model run by the trainer; these keys have no effect (compat.py)."""

    name: Optional[str] = II("oc.select:actor_rollout_ref.rollout.name")
    """Compatibility-only (compat.py); in verl: the teacher's inference engine."""
    dtype: Optional[str] = II("oc.select:actor_rollout_ref.rollout.dtype")
    """Compatibility-only (compat.py); in verl: the teacher engine's dtype."""
    gpu_memory_utilization: float = 0.5
    """Compatibility-only (compat.py)."""
    enforce_eager: bool = True
    """Compatibility-only (compat.py)."""
    cudagraph_capture_sizes: Optional[Any] = None
    """Compatibility-only (compat.py)."""
    free_cache_engine: bool = True
    """Compatibility-only (compat.py)."""
    data_parallel_size: int = 1
    """Compatibility-only (compat.py)."""
    expert_parallel_size: int = 1
    """Compatibility-only (compat.py)."""
    tensor_model_parallel_size: int = 2
    """Compatibility-only (compat.py)."""
    max_num_batched_tokens: int = 8192
    """Compatibility-only (compat.py)."""
    max_model_len: Optional[int] = None
    """Refused when smaller than prompt_length + response_length + 1 (as verl); otherwise no effect."""
    max_num_seqs: int = 1024
    """Compatibility-only (compat.py)."""
    load_format: str = "auto"
    """Compatibility-only (compat.py)."""
    engine_kwargs: Dict[str, Any] = field(default_factory=dict)
    """Compatibility-only (compat.py)."""
    limit_images: Optional[int] = None
    """Compatibility-only (compat.py)."""
    enable_chunked_prefill: bool = True
    """Compatibility-only (compat.py)."""
    enable_prefix_caching: bool = True
    """Compatibility-only (compat.py)."""
    disable_log_stats: bool = True
    """Compatibility-only (compat.py)."""
    skip_tokenizer_init: bool = True
    """Compatibility-only (compat.py)."""
    enable_sleep_mode: bool = True
    """Compatibility-only (compat.py); verl's examples add it with ``+``."""
    prompt_length: Optional[int] = II("oc.select:actor_rollout_ref.rollout.prompt_length")
    """The student's prompt length (with response_length, checked against max_model_len)."""
    response_length: Optional[int] = II("oc.select:actor_rollout_ref.rollout.response_length")
    """The student's response length."""
    temperature: Optional[float] = II("oc.select:actor_rollout_ref.rollout.temperature")
    """Compatibility-only: the teacher scores at temperature 1 (as verl: prompt log-probs ignore it)."""


@dataclass
class TeacherModelConfig:
    """One teacher (verl's ``distillation.teacher_models.<name>``)."""

    key: Optional[str] = None
    """The value of ``distillation.teacher_key`` (a row's data_source, say) whose rows this teacher scores; a single
    teacher named ``teacher_model`` scores every row."""
    model_path: Optional[str] = None
    """The teacher's HF model folder (or hub id); it must share the student's tokenizer."""
    num_replicas: int = 0
    """Compatibility-only (compat.py); in verl: inference replicas of this teacher."""
    inference: TeacherInferenceConfig = field(default_factory=TeacherInferenceConfig)
    """verl's inference-server settings of this teacher."""


@dataclass
class DistillationConfig:
    """verl's ``distillation`` section (on-policy distillation from frozen teachers)."""

    enabled: bool = False
    """Score every student rollout with the teacher(s) and add the distillation loss to the actor's update."""
    distillation_loss: DistillationLossSectionConfig = field(default_factory=DistillationLossSectionConfig)
    """The loss."""
    n_gpus_per_node: int = 8
    """Compatibility-only (compat.py); in verl: GPUs per node of the teachers' resource pool."""
    nnodes: int = 0
    """Compatibility-only (compat.py); in verl: nodes of the teachers' resource pool."""
    teacher_models: Dict[str, TeacherModelConfig] = field(
        default_factory=lambda: {"teacher_model": TeacherModelConfig()})
    """The teachers by entry name. ``teacher_model`` alone: one teacher for every row; with other entries
    (``+distillation.teacher_models.t1.key=gsm8k``) ``teacher_model`` is dropped (as verl) and each row goes to the
    teacher whose key equals its ``teacher_key`` column."""
    teacher_key: str = "data_source"
    """The row field that routes a row to its teacher in multi-teacher runs."""


# --------------------------------------------------------------------------- checks and routing
SINGLE_TEACHER = "teacher_model"
"""The default entry: alone it scores every row (key ``default``); beside other entries it is dropped (verl)."""
DEFAULT_ROUTE = "default"


def resolved_teachers(section: DistillationConfig) -> dict[str, str]:
    """{routing key: model path} as verl resolves ``teacher_models``: ``teacher_model`` alone -> {"default": its
    path}; with other entries ``teacher_model`` is dropped and each entry is keyed by its ``key``."""
    entries = dict(section.teacher_models)
    if set(entries) == {SINGLE_TEACHER}:
        return {DEFAULT_ROUTE: entries[SINGLE_TEACHER].model_path}
    entries.pop(SINGLE_TEACHER, None)
    return {teacher.key: teacher.model_path for teacher in entries.values()}


def distillation_problems(cfg, *, check_paths: bool = True) -> list[str]:
    """One line per problem of ``cfg.distillation`` (a resolved PPOConfig), found before any model loads."""
    from hybridflow.algos.distillation.registry import distillation_loss_problems

    section = cfg.distillation
    if not section.enabled:
        return []
    loss = section.distillation_loss
    problems = distillation_loss_problems("distillation.distillation_loss", loss.loss_mode,
                                          use_policy_gradient=loss.use_policy_gradient,
                                          policy_loss_mode=loss.policy_loss_mode, topk=loss.topk)
    entries = dict(section.teacher_models)
    for name, teacher in entries.items():
        if name == SINGLE_TEACHER and len(entries) > 1:
            continue
        where = f"distillation.teacher_models.{name}"
        if not teacher.model_path:
            problems.append(f"{where}.model_path is not set: pass {where}.model_path=/path/to/teacher_hf_model")
        elif check_paths and teacher.model_path.startswith(("/", ".", "~")) and not os.path.isdir(
                os.path.expanduser(teacher.model_path)):
            problems.append(f"{where}.model_path: model folder '{teacher.model_path}' does not exist")
        if len(entries) > 1 and not teacher.key:
            problems.append(f"{where}.key is not set: name the {section.teacher_key} value whose rows it scores")
        inference = teacher.inference
        needed = (inference.prompt_length or 0) + (inference.response_length or 0) + 1
        if inference.max_model_len is not None and needed > inference.max_model_len:
            problems.append(f"{where}.inference.max_model_len={inference.max_model_len} is shorter than the student's "
                            f"prompt + response + 1 = {needed}: raise it or set it to null")
    keys = [t.key for n, t in entries.items() if not (n == SINGLE_TEACHER and len(entries) > 1)]
    if len(entries) > 1 and len(set(keys)) != len(keys):
        problems.append(f"distillation.teacher_models: two teachers have the same key ({keys}); keys must differ")
    return problems

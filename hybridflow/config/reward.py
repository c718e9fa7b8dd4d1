"""verl's ``reward_model.*`` and ``custom_reward_function.*``: reward models, judges, the code sandbox, PRIME's PRM.

Part of the PPO trainer's schema (:class:`hybridflow.config.ppo.PPOConfig`); each field's docstring is its
documentation, and ``ppo_trainer.yaml`` is generated from them.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import II

from hybridflow.config.common import FSDPConfig, OptimConfig


@dataclass
class PRMOptimConfig(OptimConfig):
    """The implicit PRM's optimizer (verl-recipe PRIME's ``reward_model.model.optim``): AdamW plus its clip."""

    grad_clip: Optional[float] = 10.0
    """Clip the PRM's gradient norm to this before each step (verl-recipe PRIME's key and default; it wins over
    ``clip_grad``, which applies when this is null)."""


@dataclass
class RewardModelModelConfig:
    """A sequence-classification reward model."""

    input_tokenizer: Optional[str] = II("actor_rollout_ref.model.path")
    """Compatibility-only (compat.py); in verl: tokenizer of the policy (responses are decoded with it and re-templated for the RM)."""
    path: Optional[str] = None
    """Reward model folder or hub id."""
    external_lib: Optional[str] = None
    """Python module to import before loading."""
    trust_remote_code: bool = False
    """Allow models with custom code."""
    use_remove_padding: bool = False
    """Compatibility-only, no effect (see compat.py)."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 settings of PRIME's implicit PRM (a scoring reward model runs unsharded in fp32)."""
    update: str = "before"
    """PRIME (main_prime): when the implicit PRM trains each step: ``before`` (one update on the step's batch, then
    its dense rewards from the updated weights; the recipe's double forward) or ``none`` (frozen at the initial
    weights). The recipe's ``after`` and ``reverse`` are refused."""
    beta_train: float = 0.05
    """PRIME: beta of the implicit PRM: dense rewards ``beta * log(pi_phi / pi_ref)`` and the CE loss's logits."""
    loss_type: str = "ce"
    """PRIME: the PRM's loss; ``ce`` (the cross-entropy on the outcome labels) is the only one, as in the recipe."""
    optim: PRMOptimConfig = field(default_factory=lambda: PRMOptimConfig(lr=1e-6, weight_decay=0.0))
    """PRIME: the implicit PRM's AdamW and schedule (with its ``grad_clip``)."""
    enable_gradient_checkpointing: bool = False
    """PRIME: recompute the PRM's activations in the backward pass."""
    ref_path: Optional[str] = None
    """Compatibility-only (compat.py); in verl-recipe's PRIME: the PRM's own frozen reference model."""
    ref_type: str = "freeze"
    """Compatibility-only (compat.py); in verl-recipe's PRIME: ``freeze`` keeps the PRM's reference fixed."""
    tokenizer_path: Optional[str] = None
    """Compatibility-only (compat.py); in verl-recipe's PRIME: the tokenizer of the PRM."""
    use_fused_kernels: bool = False
    """Compatibility-only (compat.py); in verl-recipe's PRIME: fused log-prob kernels of the PRM."""
    fused_kernel_options: Dict[str, Any] = field(default_factory=dict)
    """Compatibility-only (compat.py); in verl-recipe's PRIME: options of the fused kernels."""


@dataclass
class SandboxConfig:
    """Code-execution rewards."""

    url: Optional[str] = None
    """Compatibility-only (compat.py); in verl: a remote sandbox service; null runs code in a local sandboxed subprocess."""
    max_concurrent: int = 64
    """Compatibility-only (compat.py); in verl: programs run at once."""
    memory_limit_mb: int = 1024
    """Address-space limit of one sandboxed program (MB)."""
    timeout_s: Optional[float] = 10.0
    """Wall-clock limit of one program; null is ``code_sandbox.DEFAULT_TIMEOUT_S`` (10 s), never unbounded."""
    allow_unsandboxed: bool = False
    """Where bubblewrap (``bwrap``) cannot run (not installed, or the kernel forbids user namespaces),
    run untrusted code anyway with resource limits only: NOT isolated from your files or processes.
    Default false: code rewards stop with an error that says how to install bubblewrap."""


@dataclass
class OverlongBufferConfig:
    """DAPO's soft overlong punishment (arXiv 2503.14476, Eq. 13)."""

    enable: bool = False
    """Apply the linear length penalty inside the buffer before max_response_length."""
    len: int = 0
    """Buffer length in tokens."""
    penalty_factor: float = 1.0
    """Penalty at the maximum length."""
    log: bool = False
    """Compatibility-only (compat.py); in verl: log the penalty as a metric."""


@dataclass
class RewardRolloutConfig:
    """The engine a generative reward model generates with (verl's ``reward_model.rollout.*``)."""

    name: str = "native"
    """Engine: ``native``, ``hf`` or ``vllm`` (as actor_rollout_ref.rollout.name)."""
    prompt_length: int = 2048
    """Longest judge prompt in tokens (longer ones keep their end, where the rating request is)."""
    response_length: int = 256
    """Most tokens of a verdict."""
    temperature: float = 0.0
    """Sampling temperature of verdicts; 0 = greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass of verdicts."""
    engine_kwargs: Dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the judge's engine."""
    dtype: str = "bfloat16"
    """Compatibility-only (compat.py): the judge runs in fp32 on CPU, as the policy's engine."""
    gpu_memory_utilization: float = 0.5
    """Compatibility-only (verl's inference server)."""
    tensor_model_parallel_size: int = 1
    """Compatibility-only (verl's inference server); the native engine is single-device."""
    enforce_eager: bool = True
    """Compatibility-only (verl's inference server)."""
    cudagraph_capture_sizes: Optional[List[int]] = None
    """Compatibility-only (verl's inference server)."""
    free_cache_engine: bool = True
    """Compatibility-only (verl's inference server)."""
    data_parallel_size: int = 1
    """Compatibility-only (verl's inference server)."""
    expert_parallel_size: int = 1
    """Compatibility-only (verl's inference server)."""
    max_num_batched_tokens: int = 8192
    """Compatibility-only (verl's inference server)."""
    max_model_len: Optional[int] = None
    """Compatibility-only (verl's inference server)."""
    max_num_seqs: int = 1024
    """Compatibility-only (verl's inference server)."""
    load_format: str = "auto"
    """Compatibility-only (verl's inference server)."""
    limit_images: Optional[int] = None
    """Compatibility-only (verl's inference server)."""
    enable_chunked_prefill: bool = True
    """Compatibility-only (verl's inference server)."""
    enable_prefix_caching: bool = True
    """Compatibility-only (verl's inference server)."""
    disable_log_stats: bool = True
    """Compatibility-only (verl's inference server)."""
    skip_tokenizer_init: bool = False
    """Compatibility-only (verl's inference server)."""


@dataclass
class JudgeConfig:
    """How a generative reward model is asked and read (hybridflow keys)."""

    prompt_template: Optional[str] = None
    """Judge prompt with {prompt} (last user message), {response} and {ground_truth}; null = a 0-10 grading prompt
    (hybridflow.rewards.generative_judge.DEFAULT_TEMPLATE)."""
    score_pattern: str = r"Score:\s*(-?\d+(?:\.\d+)?)"
    """Regex whose first group is the rating; the last match in a verdict counts."""
    score_scale: float = 10.0
    """The rating is divided by this and clipped to [0, 1]."""
    timeout_s: Optional[float] = 600.0
    """Seconds a step waits for the verdicts before giving every sample reward_model.failure_score; null = no limit."""


@dataclass
class RewardModelConfig:
    """Model- and rule-based rewards (verl's ``reward_model.*``; verl 0.9's ``reward.*`` maps here)."""

    enable: bool = False
    """Score with a reward model (in addition to / instead of rule-based scoring)."""
    strategy: str = "fsdp"
    """Compatibility-only (compat.py); in verl: backend of the reward model."""
    model: RewardModelModelConfig = field(default_factory=RewardModelModelConfig)
    """The reward model."""
    micro_batch_size: Optional[int] = None
    """Deprecated; use micro_batch_size_per_gpu."""
    micro_batch_size_per_gpu: Optional[int] = None
    """Sequences per reward-model forward."""
    max_length: Optional[int] = None
    """Truncate re-templated inputs of the reward model to this length."""
    use_dynamic_bsz: bool = II("critic.use_dynamic_bsz")
    """Compatibility-only (compat.py); in verl: token-budget micro-batches."""
    forward_max_token_len_per_gpu: int = II("critic.forward_max_token_len_per_gpu")
    """Compatibility-only (compat.py); in verl: token budget when use_dynamic_bsz."""
    reward_manager: str = "naive"
    """How rule-based scores are computed: ``naive`` (sequential), ``parallel`` / ``prime`` (process pool),
    ``dapo`` (with overlong penalty)."""
    num_workers: int = 2
    """Processes of the parallel / prime reward manager."""
    timeout_s: Optional[float] = 30.0
    """Per-sample time limit of a scorer (it runs in a killable worker process); a hung scorer gets
    ``failure_score``. null scores in-process with no limit (fastest; for trusted, quick scorers)."""
    failure_score: float = 0.0
    """Score of a sample whose scorer raised, hung or returned NaN/inf."""
    stop_when_all_fail: bool = True
    """Stop the run with an error when every sample of a step fails to score (a broken reward function or
    data); false trains on ``failure_score`` and only prints one line per step."""
    launch_reward_fn_async: bool = False
    """Compatibility-only, no effect (see compat.py)."""
    sandbox_fusion: SandboxConfig = field(default_factory=SandboxConfig)
    """Code execution settings."""
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    """DAPO overlong reward shaping."""
    reward_kwargs: Dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the reward manager, as in verl: for ``dapo``, ``overlong_buffer_cfg``
    ({enable, len, penalty_factor, log}; wins over ``overlong_buffer``) and ``max_resp_len`` (wins over
    data.max_response_length). Arguments of the scoring function go in custom_reward_function.reward_kwargs."""
    ulysses_sequence_parallel_size: int = 1
    """Compatibility-only (compat.py); in verl: only 1 is supported."""
    use_reward_loop: bool = True
    """verl's reward loop (its default). With ``enable``: a causal-LM ``model.path`` is a generative
    judge generating through ``rollout`` (verdict -> score); a sequence-classification model is scored
    directly, as with False."""
    enable_resource_pool: bool = False
    """Compatibility-only (compat.py); in verl: run the reward model in a resource pool of its own."""
    n_gpus_per_node: int = 0
    """Compatibility-only (compat.py); in verl: GPUs per node of the reward model's own pool."""
    nnodes: int = 0
    """Compatibility-only (compat.py); in verl: nodes of the reward model's own pool."""
    rollout: RewardRolloutConfig = field(default_factory=RewardRolloutConfig)
    """Engine of the generative reward model."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """Prompt and score parsing of the generative reward model."""
    mini_batch_size: int = II("actor_rollout_ref.actor.ppo_mini_batch_size")
    """PRIME: prompts per optimizer step of the implicit PRM's update (x rollout.n sequences)."""
    prime_granularity: str = "token"
    """PRIME: ``token`` (a dense reward on every response token) or ``whole`` (their sum on the last token)."""
    prime_norm: str = "batch_norm"
    """PRIME: ``batch_norm`` divides the dense rewards by the batch's largest |reverse cumulative sum|; ``none``."""


@dataclass
class CustomRewardFunctionConfig:
    """A user reward function ``compute_score(data_source, solution_str, ground_truth, extra_info=None)``."""

    path: Optional[str] = None
    """Python file that defines the function; null uses the built-in scorers routed by data_source."""
    name: str = "compute_score"
    """Function name inside the file."""
    reward_kwargs: Dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments bound to the scoring function (verl's key), built-in scorers included."""


SANDBOX_MIN_MEMORY_MB = 24
"""The smallest address-space limit under which the sandbox's Python starts, with a margin (measured with the
harness under ``python -I -S``: ``print(sum(range(10)))`` runs at 16 MB, at 12 MB the imports raise MemoryError):
below it every code sample would score 0."""


def sandbox_problems(sandbox: Any) -> list[str]:
    """The checks of ``reward_model.sandbox_fusion``."""
    problems: list[str] = []
    if sandbox.memory_limit_mb < SANDBOX_MIN_MEMORY_MB:
        problems.append(f"reward_model.sandbox_fusion.memory_limit_mb={sandbox.memory_limit_mb} is too small for a "
                        f"Python program to start (at least {SANDBOX_MIN_MEMORY_MB}; the default is 1024): every code "
                        "sample would score 0")
    return problems

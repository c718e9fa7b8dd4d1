"""verl's ``actor_rollout_ref.rollout.*``: the generation engine, its sampling, multi-turn and agent loops.

Part of the PPO trainer's schema (:class:`hybridflow.config.ppo.PPOConfig`); each field's docstring is its
documentation, and ``ppo_trainer.yaml`` is generated from them.
"""

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import II

from hybridflow.config.checks import check_choice, check_positive


@dataclass
class SamplingConfig:
    """Sampling used for validation (verl's ``rollout.val_kwargs``)."""

    top_k: int = -1
    """Top-k (-1 = off)."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    temperature: float = 0.0
    """0 means greedy."""
    n: int = 1
    """Samples per validation prompt (metrics are reported as mean@n)."""
    do_sample: bool = False
    """False forces greedy decoding."""


@dataclass
class MultiTurnConfig:
    """Multi-turn rollouts with tool calls and simulated users (verl's ``rollout.multi_turn.*``).

    Rows run the agent loop named by their ``agent_name`` column (else ``agent.default_agent_loop``);
    ``tool_agent`` is the multi-turn loop. Tool and user tokens are in the context but not in the loss
    (``response_mask`` 0)."""

    enable: bool = False
    """Run rollouts through the agent loops (hybridflow.agents) instead of one generate call."""
    max_assistant_turns: Optional[int] = None
    """Stop a conversation after this many generated turns; null = no limit but the length budget."""
    max_user_turns: Optional[int] = None
    """Stop after this many tool/user turns; null = no limit but the length budget."""
    tool_config_path: Optional[str] = None
    """Tool-config YAML: ``tools:`` list of {class_name, config, tool_schema}; null = no tools."""
    interaction_config_path: Optional[str] = None
    """Interaction YAML: ``interaction:`` list of {name, class_name, config}; rows pick one with
    ``extra_info.interaction_kwargs.name``; null = no simulated user."""
    max_parallel_calls: int = 1
    """Tool calls run (concurrently) per assistant turn; further calls get an error message back."""
    max_tool_response_length: int = 256
    """Characters of a tool's answer kept in the context."""
    tool_response_truncate_side: str = "middle"
    """What a long tool answer keeps: ``left`` (its start), ``right`` (its end) or ``middle`` (both ends)."""
    tool_timeout_s: Optional[float] = 30.0
    """Seconds one tool call may take before it is answered with a time-out error (hybridflow key);
    null = no limit. Only tools that await (or run blocking work in a thread) can be interrupted."""
    format: str = "hermes"
    """Tool-call format the parser reads: ``hermes`` (<tool_call>{json}</tool_call>) or ``llama3_json``."""
    stop_after_tool_call: bool = False
    """End a turn as soon as it closes a tool call (``</tool_call>`` for hermes; hybridflow key): the model
    cannot write past its call or imagine the tool's answer, at the price of one call per turn."""
    use_inference_chat_template: bool = False
    """Compatibility-only (compat.py); only false is supported (true is rejected): the context keeps
    the generated ids as generated (what verl does with false)."""
    tokenization_sanity_check_mode: str = "strict"
    """Compare each finished context with the chat template's rendering of the conversation: ``strict``,
    ``ignore_strippable`` (ignore whitespace) or ``disable``; a mismatch warns once and counts in the
    ``multi_turn/tokenization_mismatch`` metric."""
    num_repeat_rollouts: Optional[int] = None
    """Compatibility-only (compat.py); use rollout.n."""


@dataclass
class AgentLoopConfig:
    """Agent loops (verl's ``rollout.agent.*``)."""

    num_workers: int = 8
    """Compatibility-only (compat.py): all loops of a worker run concurrently in one event loop."""
    default_agent_loop: str = "single_turn_agent"
    """Loop for rows without ``agent_name``: ``single_turn_agent``, ``tool_agent`` or a custom one."""
    agent_loop_config_path: Optional[str] = None
    """YAML list of custom loops {name, _target_: module.Class, **kwargs}; null = built-ins only."""


@dataclass
class RolloutConfig:
    """The generation engine (verl's ``actor_rollout_ref.rollout.*``)."""

    name: str = "native"
    """Engine: ``native`` (built-in PyTorch engine, CPU/GPU), ``hf`` (model.generate), ``vllm`` or ``sglang``
    (optional GPU packages; a missing one is reported before any model loads)."""
    mode: str = "sync"
    """Compatibility-only, no effect (see compat.py)."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts."""
    top_k: int = -1
    """Top-k (-1 = off)."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    repetition_penalty: float = 1.0
    """Penalty on tokens already in the prompt or the response (vLLM's rule: a logit z becomes z / r where
    positive, z * r elsewhere); 1.0 = off. Validation rollouts too (verl's vLLM and SGLang servers apply it to every
    request); needs use_rollout_log_probs=False when set (the engine's log-probs are then of the penalised
    distribution)."""
    prompt_length: int = II("data.max_prompt_length")
    """Prompt length limit (follows data.max_prompt_length); with response_length it sizes the engine's
    context when max_model_len is null."""
    response_length: int = II("data.max_response_length")
    """Generated tokens limit; follows data.max_response_length."""
    dtype: str = "bfloat16"
    """Engine dtype (vllm / sglang; on a CPU the native and HF engines' weights and KV cache: bf16 where the CPU has
    AVX-512-BF16 / AMX, fp32 elsewhere, said once; ``float32`` always fp32; the sampler computes in fp32)."""
    gpu_memory_utilization: float = 0.5
    """Fraction of GPU memory the engine may use: vllm / sglang for weights + KV cache; native, what the process
    may reach once its paged KV cache is allocated, of the GPU's memory on CUDA and of the RAM on CPU (fewer blocks
    than max_num_seqs sequences could use: sequences then wait, or are preempted and recomputed)."""
    ignore_eos: bool = False
    """Keep generating after EOS, to response_length (benchmarking only; every backend)."""
    enforce_eager: bool = False
    """Disable CUDA graphs (native: the decode step runs eagerly; vllm). verl HEAD's default, False."""
    cudagraph_capture_sizes: Optional[List[int]] = None
    """Native engine on CUDA: the batch sizes whose decode step is captured as a CUDA graph; null = its ladder
    (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, ... up to max_num_seqs)."""
    free_cache_engine: bool = True
    """Give the rollout engine's KV cache back after every generate (verl's hybrid engine memory sharing), so the
    old log-probs, reference, update and weight sync run without it; the next generate allocates it again.
    native: the block pool, CPU slot mirror and CUDA graphs are freed (graphs are captured again, per batch size,
    at the next rollout); vllm: sleep mode (level 1); sglang: the memory saver; hf: nothing to free. False keeps
    the cache (and the graphs) across steps, for a card with room for both."""
    load_format: str = "dummy_dtensor"
    """Compatibility-only, no effect (see compat.py)."""
    layered_summon: bool = False
    """Compatibility-only, no effect (see compat.py)."""
    tensor_model_parallel_size: int = 1
    """vllm / sglang tensor parallel degree (the native engine is single-device)."""
    max_num_batched_tokens: int = 8192
    """Tokens one engine step computes at most. native: with enable_chunked_prefill, one decode token per live row
    plus prefill chunks of waiting prompts with what is left (must exceed max_num_seqs); without, the prompt tokens
    of one packed prefill pass (a longer prompt gets a pass of its own). vllm: the same key; sglang:
    chunked_prefill_size."""
    max_model_len: Optional[int] = None
    """Context limit of the engine (native, hf, vllm, sglang); null = prompt_length + response_length."""
    max_num_seqs: int = 1024
    """Most sequences decoded at once (native: rows of a decode step; vllm / sglang: running requests)."""
    log_prob_micro_batch_size: Optional[int] = None
    """Deprecated; use log_prob_micro_batch_size_per_gpu."""
    log_prob_micro_batch_size_per_gpu: Optional[int] = None
    """Sequences per old-log-prob forward on each worker; null = all at once."""
    log_prob_use_dynamic_bsz: bool = II("actor_rollout_ref.actor.use_dynamic_bsz")
    """Token-budget micro-batches for the old-log-prob forward."""
    log_prob_max_token_len_per_gpu: int = II("actor_rollout_ref.actor.ppo_max_token_len_per_gpu")
    """Token budget when log_prob_use_dynamic_bsz."""
    disable_log_stats: bool = True
    """Compatibility-only (compat.py); in verl: vllm: silence its statistics."""
    enable_chunked_prefill: bool = True
    """Prefill long prompts in chunks within each step's max_num_batched_tokens, beside the live rows' decode, so
    a long prompt never stalls decoding for more than one budget (native, vllm, sglang). False: a waiting prompt
    is prefilled whole before it joins."""
    do_sample: bool = True
    """False makes training rollouts greedy."""
    n: int = 1
    """Responses sampled per prompt (GRPO's group size)."""
    seed: int = 0
    """Base seed of rollout sampling (mixed with the step number)."""
    engine_kwargs: Dict[str, Any] = field(default_factory=lambda: {"vllm": {}, "sglang": {}, "native": {}})
    """Backend-specific keyword arguments, keyed by backend name; they win over the sizing keys above."""
    val_kwargs: SamplingConfig = field(default_factory=SamplingConfig)
    """Sampling used for validation."""
    calculate_log_probs: bool = False
    """Compatibility-only (compat.py); in verl: record the engine's log-probs (for the rollout/training mismatch metric); the native engine always does."""
    update_weights_bucket_megabytes: int = 512
    """Compatibility-only (compat.py); in verl: size of the buckets weights are synced in."""
    enable_prefix_caching: bool = True
    """native, multi-turn rollouts: keep the KV blocks of finished turns, named by their tokens, and prefill only
    what a later prompt adds (the observation); budget ``engine_kwargs.native.prefix_cache_tokens``
    (default 32768 tokens). The cache serves one rollout batch: it is emptied at the start of each (so a resumed
    run reproduces the uninterrupted one bit for bit). Read by the native engine only (vllm: set engine_kwargs.vllm.enable_prefix_caching);
    single-turn rollouts never reuse a prefix (the weights change every step)."""
    over_sample_rate: float = 0.0
    """In [0, 1). Train on the first ``ceil((1 - over_sample_rate) * N)`` of a batch's N samples to finish; the rest
    are aborted: their tokens carry no loss (they are still scored and stay in their group's baseline). The engines
    decode a batch in lockstep, so the first to finish are the shortest (ties: earlier samples first); 0 keeps
    every sample. ``rollout/aborted_share`` reports the share (hybridflow.algos.over_sample)."""
    multi_stage_wake_up: bool = False
    """Compatibility-only (compat.py); in verl: wake SGLang's weights and KV cache in two stages."""
    enable_sleep_mode: bool = True
    """Compatibility-only (compat.py); in verl: let vLLM release its memory between rollouts."""
    checkpoint_engine: Dict[str, Any] = field(default_factory=dict)
    """Compatibility-only (compat.py); in verl: the engine that streams weights to the rollout servers."""
    trace: Dict[str, Any] = field(default_factory=dict)
    """Compatibility-only (compat.py); in verl: trace rollouts to mlflow / weave."""
    sglang_rollout_mode: Optional[str] = None
    """Compatibility-only (compat.py); in older verl: SGLang in the trainer process or as a server."""
    profiler: Dict[str, Any] = field(default_factory=dict)
    """Compatibility-only (compat.py); in verl: this role's nsys / torch profiler settings."""
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    """Multi-turn rollouts with tools and simulated users."""
    agent: AgentLoopConfig = field(default_factory=AgentLoopConfig)
    """Agent-loop selection."""


def multi_turn_problems(multi_turn: Any) -> list[str]:
    """The checks of ``actor_rollout_ref.rollout.multi_turn``."""
    problems: list[str] = []
    key = "actor_rollout_ref.rollout.multi_turn"
    check_choice(problems, f"{key}.tool_response_truncate_side", multi_turn.tool_response_truncate_side,
                  ("left", "right", "middle"))
    check_choice(problems, f"{key}.tokenization_sanity_check_mode", multi_turn.tokenization_sanity_check_mode,
                  ("strict", "ignore_strippable", "disable"))
    check_positive(problems, f"{key}.max_parallel_calls", multi_turn.max_parallel_calls)
    check_positive(problems, f"{key}.max_tool_response_length", multi_turn.max_tool_response_length)
    for name in ("max_assistant_turns", "max_user_turns"):  # verl reads 0 as "no limit", silently
        turns = getattr(multi_turn, name)
        if turns is not None and turns <= 0:
            problems.append(f"{key}.{name}={turns} would allow no turn (verl silently reads 0 as no limit); set it "
                            "to null for no limit or to a positive number of turns")  # fmt: skip
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
    return problems


def check_rollout(problems: list[str], cfg: Any, model_max_len: int | None) -> None:
    """Sampling settings, the engine's log-probs as the trainer's, the step budget, the lengths against the model."""
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
    if rollout.temperature <= 0:  # the log-probs divide the logits by it: at 0 every update is NaN (verl's too)
        problems.append(f"actor_rollout_ref.rollout.temperature={rollout.temperature}: training rollouts are scored by "
                        "softmax(logits / temperature), undefined at 0; sample with a temperature > 0 (verl's default "
                        "1.0) and validate greedily with rollout.val_kwargs.temperature=0 (do_sample=False)")
    if not 0 < rollout.top_p <= 1:
        problems.append(f"actor_rollout_ref.rollout.top_p={rollout.top_p} must be in (0, 1]")
    check_positive(problems, "actor_rollout_ref.rollout.val_kwargs.n", rollout.val_kwargs.n)
    _check_token_budget(problems, rollout)
    check_positive(problems, "data.max_prompt_length", data.max_prompt_length)
    check_positive(problems, "data.max_response_length", data.max_response_length)
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
    check_positive(problems, key, rollout.max_num_batched_tokens)

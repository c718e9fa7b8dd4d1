"""The PPO / GRPO trainer's config: verl's keys, meanings and (where sensible) defaults.

This file is the single source of truth. ``hybridflow/config/ppo_trainer.yaml`` is
generated from it (``hybridflow config dump ppo``) and a test keeps the two equal.
Fields written ``II("...")`` are interpolations resolved after overrides, as in verl.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import II, MISSING

from hybridflow.config.common import CheckpointContentsConfig, FSDPConfig, OptimConfig


# --------------------------------------------------------------------------- data
@dataclass
class CustomClassConfig:
    """A user class loaded from a file: ``path`` to a .py file, ``name`` of the class."""

    path: Optional[str] = None
    """Refused when set (a user dataset class is not supported); in verl: python file that defines the class."""
    name: Optional[str] = None
    """Refused when set with ``path``; in verl: class name inside that file."""


@dataclass
class SamplerConfig:
    """verl's ``data.sampler``: a user sampler class (curriculum learning) that orders the training prompts."""

    class_path: Optional[str] = None
    """Refused when set (a user sampler is not supported: the training set is shuffled by ``data.shuffle`` /
    ``data.seed``); in verl: python file or module that defines the sampler class."""
    class_name: Optional[str] = None
    """Refused when set with ``class_path``; in verl: the sampler class (an AbstractSampler) in that file."""


@dataclass
class DataConfig:
    """Prompt data (verl's ``data.*``). Rows: prompt (chat messages), data_source, ability, reward_model, extra_info."""

    tokenizer: Optional[str] = None
    """Tokenizer path; null uses the actor model's tokenizer."""
    train_files: Any = "~/data/gsm8k/train.parquet"
    """Training parquet/jsonl file or list of files; a folder of them, or a ``datasets`` save_to_disk folder."""
    val_files: Any = "~/data/gsm8k/test.parquet"
    """Validation parquet/jsonl file, list of files or folder (as train_files); null disables validation."""
    prompt_key: str = "prompt"
    """Column holding the prompt as a list of chat messages."""
    reward_fn_key: str = "data_source"
    """Column used to route each row to its reward function."""
    max_prompt_length: int = 512
    """Prompt length limit in tokens (after the chat template)."""
    max_response_length: int = 512
    """Maximum number of generated tokens per response."""
    train_batch_size: int = 1024
    """Prompts per training step (each is sampled ``rollout.n`` times)."""
    gen_batch_size: Optional[int] = None
    """Prompts per generation batch (DAPO's dynamic sampling): each round generates this many prompts'
    groups and keeps the informative ones until ``train_batch_size`` groups are collected; null =
    train_batch_size. Without ``algorithm.filter_groups.enable`` it must equal train_batch_size."""
    val_batch_size: Optional[int] = None
    """Prompts per validation generation batch; null = the whole validation set at once."""
    return_raw_input_ids: bool = False
    """Compatibility-only (compat.py); in verl: keep the unpadded prompt ids (needed when the reward model uses another tokenizer)."""
    return_raw_chat: bool = False
    """Keep the raw chat messages in the batch."""
    return_full_prompt: bool = False
    """Compatibility-only (compat.py); in verl: keep the templated prompt text in the batch."""
    shuffle: bool = True
    """Shuffle the training set each epoch (reproducibly from ``seed`` and the epoch)."""
    seed: int = 1
    """Seed of the training-set shuffle."""
    dataloader_num_workers: int = 0
    """Compatibility-only (compat.py); in verl: worker processes of the DataLoader (0 = in the main process; tokenisation is done up front)."""
    validation_shuffle: bool = False
    """Shuffle the validation set."""
    filter_overlong_prompts: bool = False
    """Drop rows whose templated prompt is longer than ``max_prompt_length``."""
    filter_overlong_prompts_workers: int = 1
    """Compatibility-only, no effect (see compat.py)."""
    filter_accuracy: bool = False
    """verl-recipe's PRIME: the prompt groups whose accuracy (mean score of their n responses) lies within the
    accuracy bounds are trained on first (the others fill up the batch after them)."""
    accuracy_lower_bound: float = 0.0
    """verl-recipe's PRIME: the lowest accuracy of a group that passes ``filter_accuracy``."""
    accuracy_upper_bound: float = 1.0
    """verl-recipe's PRIME: the highest accuracy of a group that passes ``filter_accuracy``."""
    oversample_factor: float = 1.0
    """verl-recipe's PRIME: each step generates ``train_batch_size x oversample_factor`` prompts' groups and trains
    on ``train_batch_size`` of them, the groups that pass the filters first."""
    filter_truncate: bool = False
    """verl-recipe's PRIME: a group with a response of ``max_response_length - 1`` tokens or more does not pass."""
    truncation: str = "error"
    """What to do with a prompt that is still too long: ``error``, ``left``, ``right`` or ``middle``."""
    max_samples: int = -1
    """Use at most this many training rows (-1 = all)."""
    train_max_samples: int = -1
    """Newer verl spelling of ``max_samples`` for the training set."""
    val_max_samples: int = -1
    """Use at most this many validation rows (-1 = all)."""
    trust_remote_code: bool = False
    """Allow a tokenizer with custom code."""
    custom_cls: CustomClassConfig = field(default_factory=CustomClassConfig)
    """A user dataset class (path + name) instead of the built-in RL dataset: refused before anything loads."""
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    """A user sampler class (verl's curriculum sampler): refused before anything loads."""
    apply_chat_template_kwargs: Dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for ``tokenizer.apply_chat_template`` (e.g. enable_thinking)."""
    use_shm: bool = False
    """Compatibility-only, no effect (see compat.py)."""
    image_key: str = "images"
    """Column of a row's images (a vision-language policy: each ``<image>`` of the prompt is the next one)."""
    video_key: str = "videos"
    """Column of a row's videos: a row that carries any is refused (videos are not supported; give the frames as
    images in ``image_key``)."""
    return_multi_modal_inputs: bool = True
    """Compatibility-only (compat.py); in verl: keep the processor's vision inputs in the batch."""


# --------------------------------------------------------------------------- model
@dataclass
class ModelConfig:
    """The policy model (verl's ``actor_rollout_ref.model.*``)."""

    path: str = MISSING
    """Local HF folder or hub id of the model to train (``hybridflow models tiny DIR`` makes a test model)."""
    custom_chat_template: Optional[str] = None
    """A Jinja chat template that replaces the tokenizer's."""
    external_lib: Optional[str] = None
    """Python module to import before loading (registers custom architectures)."""
    override_config: Dict[str, Any] = field(default_factory=dict)
    """Entries that override the model's HF config (e.g. attn_implementation, dropout)."""
    enable_gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory (verl defaults to true; off is faster on CPU)."""
    enable_activation_offload: bool = False
    """Compatibility-only, no effect (see compat.py)."""
    use_remove_padding: bool = False
    """Padding-free forwards for the actor update and the old / reference log-prob passes: the
    valid tokens of a micro-batch go through the model as one packed row, attention kept inside
    each sequence. Same log-probs and gradients as the padded layout (within fp32 rounding)."""
    use_shared_prompt: bool = True
    """hybridflow extension (implies use_remove_padding), on by default: the rollout.n responses of a
    prompt share one copy of its tokens in the packed row (each response attends to the prompt and to
    itself), so the prompt is computed once per group in the forward and the backward. Same gradients
    as the padded layout within fp32 rounding; a model whose attention does not go through transformers'
    attention interface falls back to the padded layout with one warning. False (and use_remove_padding
    False) chooses the padded layout."""
    lora_rank: int = 0
    """LoRA rank; 0 trains the full model."""
    lora_alpha: int = 16
    """LoRA scaling numerator (scale = alpha / rank)."""
    target_modules: Any = "all-linear"
    """Modules that get LoRA adapters: ``all-linear`` or a list of module names."""
    exclude_modules: Optional[Any] = None
    """Modules excluded from LoRA."""
    use_liger: bool = False
    """Compatibility-only, no effect (see compat.py)."""
    use_fused_kernels: bool = False
    """Log-probs and entropy (actor, reference, old log-probs) from the final hidden states and the LM
    head's weight in chunks of tokens, never the ``[tokens, vocab]`` logits; backward recomputes each
    chunk (``hybridflow/algos/linear_logprob.py``). Same values; a head that is not a bias-free linear
    layer falls back to the logits with one warning. ``use_torch_compile`` / ``entropy_checkpointing``
    apply to the logits path only (the chunked one always recomputes)."""
    trust_remote_code: bool = False
    """Allow models with custom code."""
    use_shm: bool = False
    """Compatibility-only (compat.py): verl copies the model to /dev/shm before loading."""
    dtype: Optional[str] = None
    """Compute dtype of actor and reference (mixed precision: ``bf16`` or ``fp16``; weights stay in
    ``fsdp_config.model_dtype``); ``fsdp_config.mixed_precision`` wins when set; null = its default (bf16 on a GPU
    and on a CPU with bf16 units, else the weights' dtype)."""
    attn_implementation: Optional[str] = None
    """HF attention implementation (``eager``, ``sdpa``, ``flash_attention_2``); null = transformers' default."""


# --------------------------------------------------------------------------- actor
@dataclass
class PolicyLossConfig:
    """Which policy loss the actor uses and its mode-specific knobs."""

    loss_mode: str = "vanilla"
    """Registered policy loss: vanilla, gspo, gpg, clip_cov, kl_cov, cispo, geo_mean, sapo, dppo_tv, dppo_kl, dro
    (``hybridflow.algos.list_policy_losses()``). ``algorithm.rollout_correction.bypass_mode`` replaces it by
    bypass_mode."""
    clip_cov_ratio: float = 0.0002
    """clip_cov: fraction of tokens whose gradient is detached."""
    clip_cov_lb: float = 1.0
    """clip_cov: lower bound of the covariance window."""
    clip_cov_ub: float = 5.0
    """clip_cov: upper bound of the covariance window."""
    kl_cov_ratio: float = 0.0002
    """kl_cov: fraction of tokens that get the KL penalty."""
    ppo_kl_coef: float = 0.1
    """kl_cov: coefficient of the per-token KL penalty."""
    dro_beta: Optional[float] = None
    """dro: coefficient of the quadratic log-ratio penalty; must be set (> 0) when loss_mode=dro."""


@dataclass
class ActorConfig:
    """The trained policy (verl's ``actor_rollout_ref.actor.*``)."""

    strategy: str = "fsdp"
    """Compatibility-only (compat.py); in verl: training backend: ``fsdp``/``fsdp2`` (FSDP2 ``fully_shard``; world size 1 runs it unsharded)."""
    ppo_mini_batch_size: int = 256
    """Prompts per optimizer step (multiplied by rollout.n internally, as in verl)."""
    ppo_micro_batch_size: Optional[int] = None
    """Deprecated global micro-batch size; use ppo_micro_batch_size_per_gpu."""
    ppo_micro_batch_size_per_gpu: Optional[int] = None
    """Sequences per forward/backward on each worker; null = the whole mini-batch shard."""
    use_dynamic_bsz: bool = False
    """Pack micro-batches up to ``ppo_max_token_len_per_gpu`` tokens instead of a fixed count."""
    ppo_max_token_len_per_gpu: int = 16384
    """Token budget of one micro-batch when use_dynamic_bsz."""
    clip_ratio: float = 0.2
    """PPO clip epsilon of a side whose clip_ratio_low/high is null. As in verl 0.9 both are 0.2 by default and
    win, so setting only clip_ratio changes nothing (said once at start-up)."""
    clip_ratio_low: Optional[float] = 0.2
    """Lower clip epsilon (verl 0.9's default 0.2); null = clip_ratio."""
    clip_ratio_high: Optional[float] = 0.2
    """Upper clip epsilon (verl 0.9's default 0.2; DAPO clip-higher uses 0.28); null = clip_ratio."""
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    """Policy loss mode and its parameters."""
    clip_ratio_c: float = 3.0
    """Dual-clip bound for negative advantages (arXiv 1912.09729); must be > 1."""
    loss_agg_mode: str = "token-mean"
    """token-mean, token-sum, seq-mean-token-sum, seq-mean-token-mean or seq-mean-token-sum-norm."""
    loss_scale_factor: Optional[float] = None
    """seq-mean-token-sum-norm: the constant each sequence's token sum is divided by; null = data.max_response_length."""
    tau_pos: float = 1.0
    """sapo: gate temperature for tokens with a positive advantage (arXiv 2511.20347)."""
    tau_neg: float = 1.05
    """sapo: gate temperature for tokens with a non-positive advantage."""
    calculate_sum_pi_squared: bool = False
    """Also compute sum_v pi(v)^2 per token in the old-log-prob pass; needed by the optimal_token_baseline and
    tir_optimal_token_baseline estimators."""
    entropy_coeff: float = 0.0
    """Weight of the entropy bonus in the actor loss (non-zero: ``actor/entropy_loss`` is logged, as in verl)."""
    calculate_entropy: bool = False
    """Compute the entropy in the training forward and log ``actor/entropy_loss`` even when entropy_coeff is 0
    (verl 0.9's key)."""
    use_kl_loss: bool = False
    """Add KL(actor || reference) to the loss (GRPO style) instead of to the reward."""
    use_torch_compile: bool = False
    """torch.compile the log-prob/entropy math from the logits (verl defaults to true; off here: on CPU
    the compile time outweighs the gain, see docs/trainer.md)."""
    kl_loss_coef: float = 0.001
    """Weight of the KL loss."""
    kl_loss_type: str = "low_var_kl"
    """KL estimator of the loss: kl/k1, abs, mse/k2, low_var_kl/k3, or a '+' variant (straight-through k2 gradient)."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    use_rollout_log_probs: bool = False
    """Take the old log-probs from the rollout engine instead of recomputing them (verl's rollout-correction
    bypass mode): saves one forward pass per step. Exact when engine and trainer compute the same
    distribution (native engine, fp32, top_p=1, top_k=-1); the rollout/training mismatch metric is then
    not available."""
    shuffle: bool = False
    """Shuffle sequences between mini-batches."""
    checkpoint: CheckpointContentsConfig = field(default_factory=CheckpointContentsConfig)
    """What actor checkpoints hold."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and schedule."""
    grad_clip: Optional[float] = None
    """verl before 0.9's clip threshold (verl 0.9 ignores it and clips at ``optim.clip_grad``): null follows
    ``optim.clip_grad``; a value set off 1.0 clips there, as before 0.9, with one line at start-up (<= 0 disables
    clipping); refused when ``optim.clip_grad`` is also moved off 1.0 to another value."""
    freeze_vision_tower: bool = False
    """A vision-language policy: the vision tower is not trained (no gradients, weights unchanged)."""
    ulysses_sequence_parallel_size: int = 1
    """Ulysses sequence parallelism: groups of this many ranks split each packed row between them and
    exchange attention heads with all-to-all (hybridflow.models.ulysses); the data-parallel size is
    ranks / this. Must divide nnodes x n_gpus_per_node and the attention heads; needs
    model.use_remove_padding. The local backend (one process) runs whole sequences and warns."""
    entropy_from_logits_with_chunking: bool = False
    """Compatibility-only, no effect (see compat.py)."""
    entropy_checkpointing: bool = False
    """Recompute the entropy's softmax in backward instead of keeping a ``[B, T, V]`` tensor (saves memory)."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 settings."""
    profiler: Dict[str, Any] = field(default_factory=dict)
    """Compatibility-only (compat.py); in verl: this role's nsys / torch profiler settings."""


@dataclass
class RefConfig:
    """The frozen reference policy (verl's ``actor_rollout_ref.ref.*``)."""

    strategy: str = II("actor_rollout_ref.actor.strategy")
    """Compatibility-only (compat.py); in verl: backend; follows the actor."""
    use_torch_compile: bool = II("actor_rollout_ref.actor.use_torch_compile")
    """torch.compile the log-prob computation."""
    log_prob_micro_batch_size: Optional[int] = None
    """Deprecated; use log_prob_micro_batch_size_per_gpu."""
    log_prob_micro_batch_size_per_gpu: Optional[int] = None
    """Sequences per reference forward on each worker; null = all at once."""
    log_prob_use_dynamic_bsz: bool = II("actor_rollout_ref.actor.use_dynamic_bsz")
    """Token-budget micro-batches for the reference forward."""
    log_prob_max_token_len_per_gpu: int = II("actor_rollout_ref.actor.ppo_max_token_len_per_gpu")
    """Token budget when log_prob_use_dynamic_bsz."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 settings of the reference."""
    ulysses_sequence_parallel_size: int = II("actor_rollout_ref.actor.ulysses_sequence_parallel_size")
    """Sequence parallelism of the reference; it runs in the actor's processes, so it follows
    actor.ulysses_sequence_parallel_size; 1 runs whole sequences on every rank of a group (same values,
    redundant work)."""
    entropy_checkpointing: bool = False
    """Compatibility-only (compat.py); in verl: the reference's entropy memory switch (it computes no entropy)."""
    entropy_from_logits_with_chunking: bool = False
    """Compatibility-only (compat.py); in verl: the reference's entropy memory switch (it computes no entropy)."""
    profiler: Dict[str, Any] = field(default_factory=dict)
    """Compatibility-only (compat.py); in verl: this role's nsys / torch profiler settings."""


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


@dataclass
class ActorRolloutRefConfig:
    """Actor, rollout and reference: colocated in one worker group by default (the hybrid engine)."""

    hybrid_engine: bool = True
    """Compatibility-only (compat.py); in verl: colocate actor, rollout and reference in the same workers; weights resharded in memory."""
    checkpoint_engine: Any = None
    """Compatibility-only (compat.py); in verl's async recipes: the weight-streaming engine (their YAML points it
    at async_training.checkpoint_engine)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """Training of the policy."""
    ref: RefConfig = field(default_factory=RefConfig)
    """Reference policy for the KL term."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation."""
    nccl_timeout: int = 600
    """Compatibility-only (compat.py); in verl: collective time-out in seconds."""


# --------------------------------------------------------------------------- critic
@dataclass
class CriticModelConfig:
    """The value model: a causal-LM backbone with a scalar head."""

    path: Optional[str] = II("actor_rollout_ref.model.path")
    """Model to initialise the critic from; follows the actor's model."""
    tokenizer_path: Optional[str] = II("actor_rollout_ref.model.path")
    """Tokenizer; follows the actor's model."""
    override_config: Dict[str, Any] = field(default_factory=dict)
    """Entries that override the model's HF config."""
    external_lib: Optional[str] = None
    """Python module to import before loading."""
    trust_remote_code: bool = False
    """Allow models with custom code."""
    enable_gradient_checkpointing: bool = False
    """Recompute activations in backward."""
    enable_activation_offload: bool = False
    """Compatibility-only, no effect (see compat.py)."""
    use_remove_padding: bool = False
    """Padding-free value forwards (one packed row per micro-batch); same values and gradients."""
    use_shared_prompt: bool = True
    """hybridflow extension (implies use_remove_padding), on by default: the responses of a prompt share
    its tokens; False (and use_remove_padding False) chooses the padded layout."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 settings."""
    lora_rank: int = 0
    """Compatibility-only (compat.py); in verl: LoRA rank of the critic; 0 = full."""
    lora_alpha: int = 16
    """Compatibility-only (compat.py); in verl: LoRA alpha of the critic."""
    target_modules: Any = "all-linear"
    """Compatibility-only (compat.py); in verl: LoRA target modules of the critic."""
    use_shm: bool = False
    """Compatibility-only, no effect (see compat.py)."""


@dataclass
class CriticConfig:
    """The critic (verl's ``critic.*``), used when ``algorithm.adv_estimator=gae``."""

    enable: Optional[bool] = None
    """Force the critic on/off; null = on exactly when adv_estimator is gae."""
    rollout_n: int = II("actor_rollout_ref.rollout.n")
    """Follows rollout.n."""
    strategy: str = "fsdp"
    """Compatibility-only (compat.py); in verl: training backend."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5, min_lr_ratio=None))
    """Optimizer of the value model."""
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    """The value model."""
    ppo_mini_batch_size: int = II("actor_rollout_ref.actor.ppo_mini_batch_size")
    """Prompts per critic optimizer step; follows the actor."""
    ppo_micro_batch_size: Optional[int] = None
    """Deprecated; use ppo_micro_batch_size_per_gpu."""
    ppo_micro_batch_size_per_gpu: Optional[int] = None
    """Sequences per critic forward/backward on each worker; null = the whole mini-batch shard."""
    forward_micro_batch_size: Optional[int] = None
    """Deprecated; use forward_micro_batch_size_per_gpu."""
    forward_micro_batch_size_per_gpu: Optional[int] = None
    """Sequences per value forward; null = all at once."""
    use_dynamic_bsz: bool = II("actor_rollout_ref.actor.use_dynamic_bsz")
    """Token-budget micro-batches."""
    ppo_max_token_len_per_gpu: int = 32768
    """Token budget of one training micro-batch when use_dynamic_bsz."""
    forward_max_token_len_per_gpu: int = 32768
    """Token budget of one forward micro-batch when use_dynamic_bsz."""
    ppo_epochs: int = II("actor_rollout_ref.actor.ppo_epochs")
    """Passes over each batch; follows the actor."""
    shuffle: bool = II("actor_rollout_ref.actor.shuffle")
    """Shuffle between mini-batches; follows the actor."""
    cliprange_value: float = 0.5
    """Value clipping range around the old values."""
    loss_agg_mode: str = II("actor_rollout_ref.actor.loss_agg_mode")
    """Aggregation of the value loss; follows the actor."""
    loss_scale_factor: Optional[float] = II("actor_rollout_ref.actor.loss_scale_factor")
    """seq-mean-token-sum-norm divisor of the value loss; follows the actor (null = data.max_response_length)."""
    grad_clip: Optional[float] = None
    """verl before 0.9's clip threshold of the critic (verl 0.9 clips at ``critic.optim.clip_grad``); as
    ``actor_rollout_ref.actor.grad_clip``."""
    ulysses_sequence_parallel_size: int = 1
    """Ulysses sequence parallelism of the critic's group (as actor.ulysses_sequence_parallel_size);
    needs critic.model.use_remove_padding."""
    checkpoint: CheckpointContentsConfig = field(default_factory=CheckpointContentsConfig)
    """What critic checkpoints hold."""
    profiler: Dict[str, Any] = field(default_factory=dict)
    """Compatibility-only (compat.py); in verl: this role's nsys / torch profiler settings."""


# --------------------------------------------------------------------------- rewards
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


# --------------------------------------------------------------------------- algorithm
@dataclass
class KLControlConfig:
    """Coefficient of the in-reward KL penalty (Ziegler et al. 2019, arXiv 1909.08593)."""

    type: str = "fixed"
    """``fixed`` or ``adaptive``."""
    kl_coef: float = 0.001
    """(Initial) KL coefficient."""
    horizon: int = 10000
    """Adaptive controller horizon."""
    target_kl: float = 0.1
    """Adaptive controller target KL."""


@dataclass
class FilterGroupsConfig:
    """DAPO dynamic sampling: drop groups whose responses all score the same."""

    enable: bool = False
    """Keep sampling until the batch is filled with groups that have signal."""
    metric: Optional[str] = None
    """Metric that must vary within a group: ``acc``, ``score`` or ``seq_reward``."""
    max_num_gen_batches: int = 0
    """Give up after this many generation batches (0 = no limit)."""


@dataclass
class PFPPOConfig:
    """PF-PPO (arXiv 2409.06957): resample the batch by reward before the update."""

    reweight_method: str = "pow"
    """Sampling weight of a response from its score r: ``pow`` |r|^weight_pow, ``max_min`` 1 for the batch's
    highest and lowest score and 0 otherwise, ``max_random`` 0.4 for the highest score and 0.1 otherwise."""
    weight_pow: float = 2.0
    """Exponent of the ``pow`` method."""


@dataclass
class RolloutCorrectionConfig:
    """Importance weighting / rejection between the rollout engine's and the trainer's log-probs (verl's
    ``algorithm.rollout_correction``); its ``rollout_corr/*`` metrics are reported whenever old log-probs are
    recomputed."""

    rollout_is: Optional[str] = None
    """Importance weights pi_train / pi_rollout applied in the policy loss: ``token``, ``sequence`` or null (off)."""
    rollout_is_threshold: Any = 2.0
    """A number U clamps the weights at U (truncated IS); a string ``"L_U"`` zeroes weights outside [L, U] (IcePop).
    Write bounds with a decimal point (0.5_2.0): YAML reads 1_2 as the number 12."""
    rollout_is_batch_normalize: bool = False
    """Divide the weights by their batch mean (per token, or per sequence at sequence level)."""
    rollout_rs: Optional[str] = None
    """Reject tokens / sequences too far off-policy, comma-separated options: token_k1..k3, seq_sum_k1..k3,
    seq_mean_k1..k3, seq_max_k2, seq_max_k3 (null = off)."""
    rollout_rs_threshold: Any = None
    """Threshold per rollout_rs option (one shared, or comma separated): an upper bound, or ``"L_U"`` ratio
    bounds for k1 options (with decimal points, as rollout_is_threshold)."""
    bypass_mode: bool = False
    """Use the engine's log-probs as the old ones (no recompute pass) and correct inside the loss
    (``loss_mode`` becomes bypass_mode)."""
    loss_type: str = "ppo_clip"
    """Bypass mode's objective: ``ppo_clip`` (PPO with ratio pi_theta / pi_rollout) or ``reinforce``
    (IS-weighted policy gradient)."""


@dataclass
class AlgorithmConfig:
    """Advantage estimation and KL-in-reward (verl's ``algorithm.*``)."""

    gamma: float = 1.0
    """Discount factor."""
    lam: float = 1.0
    """GAE lambda."""
    adv_estimator: str = "gae"
    """Registered advantage estimator: gae, grpo, rloo, remax, reinforce_plus_plus, gdpo, optimal_token_baseline, ...
    (``hybridflow.algos.list_advantages()``; docs/algorithms.md)."""
    norm_adv_by_std_in_grpo: bool = True
    """GRPO: divide by the group std (false = Dr.GRPO)."""
    use_kl_in_reward: bool = False
    """Subtract kl_coef * KL(actor || ref) from the token rewards."""
    kl_penalty: str = "kl"
    """KL estimator in the reward: kl/k1, abs, mse/k2, low_var_kl/k3, or a '+' variant (straight-through k2 gradient)."""
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    """KL coefficient controller."""
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    """DAPO dynamic sampling."""
    use_pf_ppo: bool = False
    """PF-PPO: resample the batch (with replacement, same size) by reward before the updates."""
    pf_ppo: PFPPOConfig = field(default_factory=PFPPOConfig)
    """PF-PPO's reweighting."""
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """Rollout/trainer mismatch correction (token / sequence importance sampling, rejection, bypass mode)."""
    gdpo_reward_keys: Optional[List[str]] = None
    """gdpo: the reward function's dict keys normalised separately (e.g. [format_reward, accuracy_reward])."""
    gdpo_reward_weights: Optional[List[float]] = None
    """gdpo: one weight per gdpo_reward_keys entry; null = all 1."""
    reward_dpo_coef: float = 5.0
    """prime: weight of the implicit PRM's dense rewards (after their leave-one-out baseline) in the advantages."""
    reward_gt_coef: float = 5.0
    """prime: weight of the outcome reward (after its leave-one-out baseline) in the advantages."""


# --------------------------------------------------------------------------- trainer
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
    behaviour log-prob it was sampled with). Native engine, single-turn; trainer.backend=local, or ray with split
    placement (rollout.n_gpus_per_node > 0)."""
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


@dataclass
class PPOConfig:
    """Everything ``python -m hybridflow.trainer.main_ppo`` reads."""

    data: DataConfig = field(default_factory=DataConfig)
    """Prompt data."""
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    """Policy, generation and reference."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """Value model (gae only)."""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """Reward computation."""
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    """A user reward function."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantage estimation."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Loop, logging, checkpoints."""
    ray_kwargs: RayKwargsConfig = field(default_factory=RayKwargsConfig)
    """Ray settings."""
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    """Asynchronous training (main_fully_async / main_one_step_off only)."""
    rollout: AsyncRolloutConfig = field(default_factory=AsyncRolloutConfig)
    """The async rollouter's budget (main_fully_async only)."""
    global_profiler: Dict[str, Any] = field(default_factory=dict)
    """Compatibility-only (compat.py); in verl: nsys / torch profiler settings."""

    def __post_init__(self):
        if self.trainer.backend == "auto":  # verl's split placement keys alone pick the Ray backend
            self.trainer.backend = "ray" if self.rollout.n_gpus_per_node > 0 else "local"

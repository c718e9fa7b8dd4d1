"""verl keys hybridflow accepts only so that existing scripts run: the one table of them.

Each entry maps a dotted key (of ``PPOConfig`` or ``SFTConfig``; a key present in both
applies to both) to a one-line reason. Such a key takes no effect; setting it to a value
other than its default logs one warning line per key and process (``warn_compat_keys``).
``docs/configuration.md`` lists this table (a test keeps the two equal) and a test walks
every config leaf: each is read by some code or listed here, never both.
"""

from __future__ import annotations

import logging
from typing import Any

from omegaconf import DictConfig, OmegaConf

logger = logging.getLogger(__name__)

_FSDP2_ONLY = "hybridflow trains with FSDP2 (fully_shard) only; fsdp and fsdp2 both select it"
_NO_SP = "the reward model scores whole sequences on each rank (no sequence parallelism)"
_NO_SHM = "models are read from the local filesystem; there is no shared-memory copy"
_WRAP = "every decoder layer is one FSDP2 unit; there is no size-based wrap policy"
_PREFETCH = "FSDP2 prefetches the next unit itself; there is no forward-prefetch switch"
_ASYNC_SAVE = "checkpoints are written synchronously (the tracker file last, atomically)"
_TOTAL_STEPS = "filled in by the trainer from the data size and total_epochs / total_training_steps"
_VLLM = "sizes the vLLM engine; the native engine sizes itself from the batch"
_WEIGHT_SYNC = "weights go to the rollout engine in memory (or by Ray object reference to a rollout pool)"
_PRIME_REF = "the implicit PRM's reference is the policy's frozen reference (actor_rollout_ref.ref)"
_PRIME_KERNELS = "the implicit PRM's log-probs run through the same forward as the actor's"
_TEACHER_POOL = ("distillation teachers are frozen models on the actor's ranks (sharded as the reference); they "
                 "have no resource pool of their own")
_RM_IN_TRAINER = "the reward model scores in the trainer process; it has no resource pool of its own"

COMPAT_ONLY: dict[str, str] = {
    # data
    "data.return_raw_input_ids": "the reward model re-templates decoded text; raw prompt ids are not kept",
    "data.return_full_prompt": "the templated prompt text is not kept in the batch",
    "data.dataloader_num_workers": "prompts are tokenised up front; batches are collated in the main process",
    "data.filter_overlong_prompts_workers": "overlong-prompt filtering is a single pass over the tokenised rows",
    "data.use_shm": _NO_SHM,
    "data.return_multi_modal_inputs": "rows with images always carry their vision inputs (multi_modal_inputs)",
    "data.balance_dp_token": "SFT micro-batches are fixed-size per rank; losses use global token counts",
    "data.multiturn.enable_thinking_key": "per-row enable_thinking is not passed to the SFT chat template",
    # policy model
    "actor_rollout_ref.hybrid_engine": "actor, rollout and reference are always colocated (the hybrid engine)",
    "actor_rollout_ref.nccl_timeout": "collectives use torch.distributed's default time-out",
    "actor_rollout_ref.model.enable_activation_offload": "activations stay on the device; use gradient checkpointing",
    "actor_rollout_ref.model.use_liger": "Liger kernels are not used; the HF model's own layers run",
    "model.use_liger": "Liger kernels are not used; the HF model's own layers run",
    "model.strategy": _FSDP2_ONLY,
    # actor / reference
    "actor_rollout_ref.actor.strategy": _FSDP2_ONLY,
    "actor_rollout_ref.actor.entropy_from_logits_with_chunking": "entropy is always computed from the logits in one pass per micro-batch",
    "actor_rollout_ref.actor.checkpoint.async_save": _ASYNC_SAVE,
    "actor_rollout_ref.actor.optim.total_training_steps": _TOTAL_STEPS,
    "actor_rollout_ref.ref.strategy": _FSDP2_ONLY,
    "actor_rollout_ref.ref.fsdp_config.optimizer_offload": "the reference policy has no optimizer",
    # rollout
    "actor_rollout_ref.rollout.mode": "generation is synchronous within a step",
    "actor_rollout_ref.rollout.load_format": "rollout weights always come from the actor in memory",
    "actor_rollout_ref.rollout.layered_summon": "weights are gathered whole, not layer by layer",
    "actor_rollout_ref.rollout.calculate_log_probs": "the engines always return the sampled tokens' log-probs",
    "actor_rollout_ref.rollout.update_weights_bucket_megabytes": "weights are synced in memory as one state dict",
    "actor_rollout_ref.rollout.disable_log_stats": _VLLM,
    # critic
    "critic.strategy": _FSDP2_ONLY,
    "critic.model.enable_activation_offload": "activations stay on the device; use gradient checkpointing",
    "critic.model.use_shm": _NO_SHM,
    # verl 0.9.1's critic and SFT model keys (issue 60)
    "critic.model.custom_chat_template": "the critic reads the actor's token ids; it never applies a chat template",
    "critic.model.exclude_modules": "the critic always trains in full; LoRA applies to the actor "
                                    "(actor_rollout_ref.model.exclude_modules)",
    "critic.model.use_liger": "Liger kernels are not used; the HF model's own layers run",
    "model.use_shm": _NO_SHM,
    "model.enable_activation_offload": "activations stay on the device; use gradient checkpointing",
    "critic.checkpoint.async_save": _ASYNC_SAVE,
    "critic.model.lora_rank": "the critic always trains in full; LoRA applies to the actor (actor_rollout_ref.model.lora_rank)",
    "critic.model.lora_alpha": "the critic always trains in full; LoRA applies to the actor (actor_rollout_ref.model.lora_rank)",
    "critic.model.target_modules": "the critic always trains in full; LoRA applies to the actor (actor_rollout_ref.model.lora_rank)",
    "critic.optim.total_training_steps": _TOTAL_STEPS,
    # reward model
    "reward_model.strategy": _FSDP2_ONLY,
    "reward_model.ulysses_sequence_parallel_size": _NO_SP,
    "reward_model.model.ref_path": _PRIME_REF,
    "reward_model.model.ref_type": _PRIME_REF,
    "reward_model.model.tokenizer_path": "the implicit PRM reads the policy's token ids (it starts as the policy)",
    "reward_model.model.use_fused_kernels": _PRIME_KERNELS,
    "reward_model.model.fused_kernel_options": _PRIME_KERNELS,
    "reward_model.model.optim.total_training_steps": _TOTAL_STEPS,
    "reward_model.model.input_tokenizer": "responses are always decoded with the policy's tokenizer",
    "reward_model.model.use_remove_padding": "the reward model scores padded batches (packing is for actor, reference, critic)",
    "reward_model.use_dynamic_bsz": "the reward model runs fixed-size micro-batches (micro_batch_size_per_gpu)",
    "reward_model.forward_max_token_len_per_gpu": "the reward model runs fixed-size micro-batches (micro_batch_size_per_gpu)",
    "reward_model.launch_reward_fn_async": "scoring runs synchronously after generation",
    "reward_model.sandbox_fusion.url": "code is run in the local sandbox (hybridflow.rewards.code_sandbox)",
    "reward_model.sandbox_fusion.max_concurrent": "the local sandbox runs one program per scorer call",
    "reward_model.overlong_buffer.log": "the dapo manager always reports its overlong penalty",
    "actor_rollout_ref.rollout.multi_stage_wake_up": "the vllm / sglang backends always wake in two stages (weights "
                                                      "before a weight sync, KV cache before a generate)",
    "actor_rollout_ref.rollout.enable_sleep_mode": "rollout.free_cache_engine decides: it builds vllm in sleep mode "
                                                   "and frees the native engine's KV cache after each generate",
    "actor_rollout_ref.rollout.checkpoint_engine": _WEIGHT_SYNC,
    "actor_rollout_ref.checkpoint_engine": _WEIGHT_SYNC,
    "async_training.checkpoint_engine": _WEIGHT_SYNC,
    "actor_rollout_ref.rollout.trace": "rollouts are not traced; trainer.rollout_data_dir dumps every rollout as JSONL",
    "async_training.use_trainer_do_validate": "the async trainer validates with the rollout engine between steps",
    **{f"{role}.profiler": "no profiler is driven by the config; run the trainer under torch.profiler or nsys "
                           "yourself" for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref",
                                                   "actor_rollout_ref.rollout", "critic")},
    "actor_rollout_ref.ref.entropy_checkpointing": "the reference computes log-probs only, no entropy",
    "actor_rollout_ref.ref.entropy_from_logits_with_chunking": "the reference computes log-probs only, no entropy",
    "actor_rollout_ref.rollout.sglang_rollout_mode": "SGLang, when installed, runs in the rollout worker's process",
    "global_profiler": "no profiler is driven by the config; run the trainer under torch.profiler or nsys yourself",
    # reward model placement
    "reward_model.enable_resource_pool": _RM_IN_TRAINER,
    "reward_model.n_gpus_per_node": _RM_IN_TRAINER,
    "reward_model.nnodes": _RM_IN_TRAINER,
    # verl 0.9's SFT trainer
    "data.use_dynamic_bsz": "SFT micro-batches hold micro_batch_size_per_gpu sequences (one packed row with "
                            "data.pad_mode=no_padding)",
    "data.max_token_len_per_gpu": "SFT micro-batches hold micro_batch_size_per_gpu sequences (one packed row with "
                                  "data.pad_mode=no_padding)",
    # verl 0.9.1's SFT trainer
    "data.num_workers": "conversations are tokenised up front; batches are collated in the main process",
    "data.ignore_input_ids_mismatch": "conversations are tokenised whole with the chat template, never turn by turn",
    # trainer
    "trainer.default_hdfs_dir": "checkpoints are written to default_local_dir only; there is no HDFS copy",
    "trainer.del_local_ckpt_after_load": "local checkpoints are never deleted on load (nothing would be left to resume from)",
    "trainer.checkpoint.async_save": _ASYNC_SAVE,
    "ray_kwargs.ray_init.timeline_json_file": "no Ray timeline is written",
    # verl internals hybridflow has one of
    "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template": (
        "the context keeps the generated ids as generated (verl's false); true is rejected"),
    "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts": "samples per prompt come from rollout.n",
    "actor_rollout_ref.rollout.agent.num_workers": (
        "all agent loops of a worker run concurrently in one event loop; there is no pool of loop workers"),
    "trainer.use_legacy_worker_impl": (
        "selects between verl's legacy and new worker classes; hybridflow has one worker implementation"),
    "actor_rollout_ref.model.use_shm": _NO_SHM,
    # verl 0.9.1's distillation teachers run as frozen models beside the actor (like the reference)
    "distillation.n_gpus_per_node": _TEACHER_POOL,
    "distillation.nnodes": _TEACHER_POOL,
    **{f"reward_model.rollout.{name}": (
        "sizes the inference server verl's reward loop runs a judge on; hybridflow's generative judge runs "
        "on an in-process engine sized by reward_model.rollout.{name,prompt_length,response_length}")
       for name in ("dtype", "gpu_memory_utilization", "enforce_eager", "cudagraph_capture_sizes",
                    "free_cache_engine", "data_parallel_size", "expert_parallel_size",
                    "tensor_model_parallel_size", "max_num_batched_tokens", "max_model_len", "max_num_seqs",
                    "load_format", "limit_images", "enable_chunked_prefill",
                    "enable_prefix_caching", "disable_log_stats", "skip_tokenizer_init")},
}
"""Dotted key -> why it has no effect in hybridflow."""

# A scoring reward model runs unsharded in fp32 in the trainer process; PRIME's implicit PRM is sharded by the other
# fsdp_config keys, and starts as the policy, in the actor's parameter dtype.
COMPAT_ONLY["reward_model.model.fsdp_config.model_dtype"] = ("a scoring reward model runs in fp32; PRIME's implicit PRM "
                                                             "takes the actor's parameter dtype")

# The FSDP2 sections: every decoder layer is a unit and FSDP2 schedules its own prefetch.
for _section in ("actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.ref.fsdp_config",
                 "critic.model.fsdp_config", "reward_model.model.fsdp_config", "model.fsdp_config"):
    COMPAT_ONLY[f"{_section}.wrap_policy.min_num_params"] = _WRAP
    COMPAT_ONLY[f"{_section}.forward_prefetch"] = _PREFETCH

_warned: set[str] = set()


def compat_keys_set(cfg: DictConfig, defaults: DictConfig) -> list[tuple[str, Any]]:
    """(key, value) of the table's keys that ``cfg`` sets to something other than the default.

    A key that still follows an interpolation (``ref.strategy`` -> ``actor.strategy``) is not
    "set": the key it follows is reported instead.
    """
    found = []
    for key in COMPAT_ONLY:
        parent_key, _, leaf = key.rpartition(".")
        parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
        if not isinstance(parent, DictConfig) or leaf not in parent or OmegaConf.is_interpolation(parent, leaf):
            continue
        value = OmegaConf.select(cfg, key, throw_on_missing=False)
        if value != _default_value(defaults, key):
            found.append((key, value))
    return found


_FOLLOWS_ANOTHER_KEY = object()


def _default_value(defaults: DictConfig, key: str) -> Any:
    """The schema's default of ``key``; a default that follows another key (``input_tokenizer`` ->
    ``actor_rollout_ref.model.path``, unset in the bare schema) is a marker no explicit value equals."""
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(defaults, parent_key) if parent_key else defaults
    if isinstance(parent, DictConfig) and leaf in parent and OmegaConf.is_interpolation(parent, leaf):
        return _FOLLOWS_ANOTHER_KEY
    return OmegaConf.select(defaults, key, throw_on_missing=False)


def megatron_keys(cfg: DictConfig, schema: type) -> list[str]:
    """The ``*.strategy`` keys set to ``megatron`` (not those following one by interpolation): refused, not warned."""
    return [key for key, value in compat_keys_set(cfg, OmegaConf.structured(schema))
            if COMPAT_ONLY[key] is _FSDP2_ONLY and value == "megatron"]


def warn_compat_keys(cfg: DictConfig, schema: type) -> list[str]:
    """One warning line per compatibility-only key set to a non-default value (once per process)."""
    lines = []
    for key, value in compat_keys_set(cfg, OmegaConf.structured(schema)):
        line = f"{key}={value!r} is accepted for verl compatibility and has no effect: {COMPAT_ONLY[key]}"
        lines.append(line)
        if key not in _warned:
            _warned.add(key)
            logger.warning(line)
    return lines


# --------------------------------------------------------------------------- docs
DOCS_BEGIN = "<!-- compat-only keys: generated by `python -m hybridflow.config.compat --write docs/configuration.md` -->"
DOCS_END = "<!-- end of compat-only keys -->"


def markdown_table() -> str:
    """The table as docs/configuration.md shows it, between DOCS_BEGIN and DOCS_END."""
    rows = [f"| `{key}` | {reason} |" for key, reason in sorted(COMPAT_ONLY.items())]
    return "\n".join([DOCS_BEGIN, "", "| key | why it has no effect |", "|---|---|", *rows, "", DOCS_END])


def write_docs(path: str) -> None:
    """Replace the generated block of ``path`` with the current table."""
    from hybridflow.config.docs import replace_block

    replace_block(path, begin=DOCS_BEGIN, end=DOCS_END, block=markdown_table())


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--write"] and len(sys.argv) == 3:
        write_docs(sys.argv[2])
    else:
        print(markdown_table())

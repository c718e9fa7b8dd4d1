"""The verl 0.9.1 keys hybridflow refuses, each with its reason class and the nearest supported way.

The key lists are a snapshot of verl 0.9.1's YAML (``hybridflow/config/verl091/*.keys``); the loader says
:func:`refusal_line` before anything loads. :mod:`hybridflow.config.verl_keys` builds the whole key table from it.
"""

from __future__ import annotations

import fnmatch
import functools
import os


SNAPSHOT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "verl091")
SNAPSHOTS = {"ppo": "ppo_trainer.keys", "sft": "sft_trainer_engine.keys"}

MEGATRON = ("Megatron-only", "hybridflow trains with FSDP2: LoRA is actor_rollout_ref.model.lora_rank / lora_alpha / "
                             "target_modules (peft)")
MTP = ("model feature not supported (multi-token-prediction heads)", "drop the mtp keys; the model trains and "
                                                                      "generates with its LM head only")
QUANT = ("quantization not supported (QAT / quantized rollout)", "train and generate in bf16 or fp32 "
                                                                 "(fsdp_config.mixed_precision)")
TURBO = ("VeOmni / TorchTitan engine internals", "FSDP2 is configured by fsdp_config (fsdp_size, param_offload, "
                                                 "mixed_precision) and ulysses_sequence_parallel_size")
TRANSFER_QUEUE = ("TransferQueue / V1 trainer internals", "the controller passes Batch objects between worker groups; "
                                                          "trainer.backend=ray for several processes")
PROFILER = ("profiler / monitoring not driven by the config", "run the trainer under torch.profiler or nsys; metrics "
                                                              "go to trainer.logger")
NPU = ("Ascend NPU-only", "run on CPU or CUDA (trainer.device)")
SERVING = ("server-engine internals (prefill/decode disaggregation, routers, custom servers)",
           "the rollout engine runs in the rollout worker: actor_rollout_ref.rollout.name picks it")
KERNELS = ("kernel option not available", "use_fused_kernels=True selects hybridflow's chunked LM head; tiled MLP "
                                          "and custom kernel backends have no counterpart")
PADDING = ("FSDP engine internals fixed in hybridflow", "FSDP2 with use_orig_params semantics, micro-batches padded to "
                                                        "their own longest row (use_remove_padding packs them)")
FILLED_IN = ("filled in by verl from another key", "set the key it follows (rollout.n, trainer.seed, the model's "
                                                   "use_remove_padding / use_fused_kernels)")
CRITIC = ("no counterpart in the critic (it computes values only: no entropy, no compiled log-probs)",
          "drop the key")
DTYPE = ("spelled differently in hybridflow", "the parameter dtype is fsdp_config.model_dtype and the compute dtype "
                                              "fsdp_config.mixed_precision")
DETERMINISM = ("deterministic-kernel switch not driven by the config", "runs are seeded by trainer.seed / "
                                                                        "rollout.seed (a resumed run samples the same)")
USER_CLASS = ("user class loading not supported (reward manager / reward loop / checkpoint callback)",
              "custom_reward_function.path for scoring, reward_model.reward_manager for a registered manager")
TOOLS = ("tool schemas are read by the agent loop only", "actor_rollout_ref.rollout.multi_turn.tool_config_path")
MULTIMODAL = ("multimodal preprocessing option not implemented", "the model's processor defaults apply "
                                                                  "(data.image_key for images)")
SERVER_OPTION = ("inference-server option", "the engines return the log-probs of the sampling distribution")
SFT_LOGITS = ("no counterpart in the SFT loss (cross-entropy from the logits: no entropy term, no chunked LM head)",
              "drop the key; model.enable_gradient_checkpointing saves activation memory")
CRITIC_ADAPTER = ("the critic trains in full (its LoRA keys have no effect)", "merge the adapter into a model folder "
                                                                              "(python -m hybridflow.model_merger) "
                                                                              "and set critic.model.path to it")
NOT_YET = ("not implemented in hybridflow", "see docs/configuration.md (verl 0.9.1 key table) for the nearest key")

REFUSED: list[tuple[str, tuple[str, str]]] = [
    # (glob over the dotted key, (reason class, nearest supported way)); first match wins
    ("*.lora.*", MEGATRON), ("*megatron*", MEGATRON),
    ("*.mtp.*", MTP), ("*.mtp", MTP), ("*.tiled_mlp.*", KERNELS), ("*.fused_kernel_options.*", KERNELS),
    ("*.qat.*", QUANT), ("*.qat", QUANT), ("*quantization*", QUANT),
    ("*turbo_config*", TURBO),
    ("transfer_queue*", TRANSFER_QUEUE), ("trainer.v1.*", TRANSFER_QUEUE), ("trainer.use_v1", TRANSFER_QUEUE),
    ("skip.*", TRANSFER_QUEUE),
    ("*.npu.*", NPU), ("profiler.*", PROFILER), ("*.prometheus.*", PROFILER), ("trainer.profile_interval", PROFILER),
    ("ray_kwargs.timeline_json_file", PROFILER), ("trainer.esi_redundant_time", NPU),
    ("*disaggregation*", SERVING), ("*.router_config_path", SERVING), ("*.custom_async_server.*", SERVING),
    ("*.scheduling_policy", SERVING), ("*.enable_rollout_routing_replay", SERVING),
    ("*.moe_load_balance_metrics_interval", SERVING), ("actor_rollout_ref.rollout.skip_tokenizer_init", SERVING),
    ("actor_rollout_ref.rollout.pipeline_model_parallel_size", SERVING),
    ("reward.reward_model.rollout.*", SERVING),
    ("*.use_orig_params", PADDING), ("*.pad_to_length*", PADDING), ("*.forward_only", PADDING),
    ("*.use_no_sync_for_gradient_accumulation", PADDING), ("*.entropy_from_logits_chunk_size", PADDING),
    ("*.rollout_n", FILLED_IN), ("*.data_loader_seed", FILLED_IN), ("*fsdp*.seed", FILLED_IN),
    ("actor_rollout_ref.actor.use_remove_padding", FILLED_IN), ("actor_rollout_ref.actor.use_fused_kernels", FILLED_IN),
    ("engine.seed", FILLED_IN),
    ("critic.fsdp.entropy_*", CRITIC), ("critic.fsdp.use_torch_compile", CRITIC),
    ("*fsdp*.dtype", DTYPE), ("engine.dtype", DTYPE), ("*.full_determinism", DETERMINISM),
    ("reward.reward_manager.*", USER_CLASS), ("reward_model.reward_loop_*", USER_CLASS),
    ("trainer.checkpoint_callback_class", USER_CLASS),
    ("*tool_path", TOOLS), ("data.tool_config_path", TOOLS),
    ("data.audio_key", MULTIMODAL),
    ("actor_rollout_ref.rollout.logprobs_mode", SERVER_OPTION),
    ("actor_rollout_ref.rollout.data_parallel_size", SERVING), ("actor_rollout_ref.rollout.expert_parallel_size",
                                                               SERVING),
    ("algorithm.filter_groups.max_inflight_gen_batches", TRANSFER_QUEUE),
    # issue 60: the last keys that fell to NOT_YET, each with its own reason
    ("*.checkpoint.strict", ("Megatron-only (strict HF export of a Megatron checkpoint)",
                             "FSDP2 checkpoints here always load and export every weight")), ("critic.model.use_fused_kernels", CRITIC),
    ("critic.model.lora_adapter_path", CRITIC_ADAPTER),
    ("model.use_fused_kernels", SFT_LOGITS), ("engine.entropy_*", SFT_LOGITS), ("engine.use_torch_compile", SFT_LOGITS),
    ("optim.total_training_steps", FILLED_IN),
]
"""Reason classes of the verl 0.9.1 keys hybridflow refuses."""


@functools.cache
def verl_keys(trainer: str) -> tuple[str, ...]:
    """The snapshot's keys of ``trainer`` (ppo or sft), in verl's order."""
    with open(os.path.join(SNAPSHOT_DIR, SNAPSHOTS[trainer])) as fh:
        return tuple(line.strip() for line in fh if line.strip() and not line.startswith("#"))


@functools.cache
def _all_verl_keys() -> frozenset:
    return frozenset(verl_keys("ppo")) | frozenset(verl_keys("sft"))


def refusal(key: str) -> tuple[str, str] | None:
    """(reason class, nearest supported way) of a verl 0.9.1 key hybridflow does not know; None for a key that is
    not verl 0.9.1's (a typo: the loader suggests the nearest key instead)."""
    if key not in _all_verl_keys():
        return None
    for pattern, reason in REFUSED:
        if fnmatch.fnmatchcase(key, pattern):
            return reason
    return NOT_YET


def refusal_line(key: str) -> str | None:
    """The one line the loader says for a refused verl 0.9.1 key (None: not a verl 0.9.1 key)."""
    reason = refusal(key)
    if reason is None:
        return None
    return f"'{key}' (verl 0.9.1) is refused: {reason[0]}; {reason[1]}"

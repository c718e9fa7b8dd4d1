"""Factories that build a role's worker inside one rank, from the PPO config.

A factory is ``factory(dp: DataParallel) -> worker``; bind the config with
``functools.partial`` and hand it to ``build_worker_group``. The same function runs in
the local backend (``dp`` = world size 1: no sharding) and in every Ray rank (``dp``
= that rank: FSDP2 across the group), so the two can only differ by the sharding.
"""

from __future__ import annotations

import copy
import functools
import logging

import torch

from hybridflow.agents.manager import build_agent_loop_manager
from hybridflow.algos import policy_loss_spec, seq_norm_length
from hybridflow.algos.rollout_correction.checks import effective_policy_loss
from hybridflow.config import config_value, reference_enabled
from hybridflow.config.verl_versions import ACTOR, grad_clip_threshold
from hybridflow.data.parallel import DataParallel
from hybridflow.models import load_causal_lm, load_tokenizer, load_value_model
from hybridflow.models.layout_guard import checked_layout
from hybridflow.models.fsdp import (Precision, autocast_forward, data_parallel_mesh, decoder_layers, resolve_precision,
                                    shard_model)
from hybridflow.models.loader import check_vocab_covers_tokenizer, import_external_lib, resolve_dtype
from hybridflow.models.loader import load_config as load_model_config
from hybridflow.models.lora import apply_lora, disable_adapter, load_lora_adapter, merged_copy
from hybridflow.models.segment_attention import supports_segment_attention
from hybridflow.models.sharded_checkpoint import FSDPModelComponent
from hybridflow.models.ulysses import split_sequences
from hybridflow.models.vision import freeze_vision_tower, is_vision_language, load_processor
from hybridflow.rollout.config import engine_kwargs_from_rollout_config
from hybridflow.rollout.engine import build_engine, engine_capabilities
from hybridflow.rollout.precision import cpu_engine_dtype
from hybridflow.trainer.roles.groups import CriticGroupWorker, HybridEngineWorker, RolloutGroupWorker
from hybridflow.trainer.roles.teacher import build_teacher, distillation_of
from hybridflow.workers.actor import ActorWorker, PolicyObjective
from hybridflow.workers.critic import CriticWorker, ValueObjective
from hybridflow.workers.logprob import forward_layout
from hybridflow.workers.micro_batches import LogProbBatching, per_rank_micro_batch_size
from hybridflow.workers.optim import train_state_from_config
from hybridflow.workers.ppo_update import UpdateSchedule
from hybridflow.workers.reference import ReferenceWorker
from hybridflow.workers.rollout import RolloutWorker
from hybridflow.workers.sequence_parallel import split_world

logger = logging.getLogger(__name__)

def rank_device() -> torch.device:
    # Ray sets CUDA_VISIBLE_DEVICES to the rank's GPU, so it is always device 0 of the process.
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def shard_for_group(model: torch.nn.Module, *, dp: DataParallel, fsdp_cfg, device: torch.device,
                    precision: Precision = Precision()) -> torch.nn.Module:
    """FSDP2 over the ranks of the group (HSDP with ``fsdp_size``) computing in ``precision``
    (MixedPrecisionPolicy); at world size 1 the plain model with its forward under autocast."""
    # A wrap class the model lacks is an error at any world size, not only once it is sharded.
    decoder_layers(model, fsdp_cfg.wrap_policy.transformer_layer_cls_to_wrap)
    if dp.world_size == 1:
        if fsdp_cfg.param_offload or fsdp_cfg.offload_policy:
            warn_param_offload_unsharded()
        return autocast_forward(model, device_type=device.type, dtype=precision.param_dtype)
    mesh = data_parallel_mesh(device.type, dp.world_size, fsdp_cfg.fsdp_size)
    return shard_model(model, mesh=mesh, precision=precision,
                       param_offload=fsdp_cfg.param_offload or fsdp_cfg.offload_policy,
                       reshard_after_forward=fsdp_cfg.reshard_after_forward,
                       layer_classes_to_wrap=fsdp_cfg.wrap_policy.transformer_layer_cls_to_wrap)


@functools.cache
def warn_param_offload_unsharded() -> None:
    """Once a process: ``fsdp_config.param_offload`` (or ``offload_policy``) takes effect through FSDP2's CPU-offload
    policy, which applies to a sharded model; one process trains the plain model (verl wraps FSDP even there)."""
    logger.warning("fsdp_config.param_offload=True has no effect with one training process: the model is not "
                   "sharded, so its parameters stay on the device (optimizer_offload does take effect); launch 2+ "
                   "ranks (torchrun / trainer.n_gpus_per_node) to offload parameters")


def training_precision(fsdp_cfg, model_dtype: str | None = None, *, device: torch.device) -> Precision:
    """Compute precision of a trained or reference model: ``fsdp_config.mixed_precision``, else the
    policy's ``model.dtype``, else the device's default (bf16 on a GPU as verl, fp32 on a CPU)."""
    return resolve_precision(fsdp_cfg.mixed_precision, fallback=model_dtype, device_type=device.type)


def policy_tokenizer(cfg):
    """The policy's tokenizer: ``data.tokenizer`` or the model's, with ``model.custom_chat_template``."""
    model = cfg.actor_rollout_ref.model
    return load_tokenizer(cfg.data.tokenizer or model.tokenizer_path or model.path,
                          chat_template=model.custom_chat_template,
                          trust_remote_code=model.trust_remote_code or cfg.data.trust_remote_code)


def check_policy_vocab(cfg, tokenizer) -> None:
    """The policy's embedding covers every id of its tokenizer (``data.tokenizer`` may be another model's)."""
    model = cfg.actor_rollout_ref.model
    config = load_model_config(model.hf_config_path or model.path, trust_remote_code=model.trust_remote_code,
                               override_config=dict(model.override_config))
    check_vocab_covers_tokenizer(config, tokenizer, model.path,
                                 tokenizer_key=f"data.tokenizer={cfg.data.tokenizer}" if cfg.data.tokenizer else
                                 "the model's own")


def policy_processor(cfg, tokenizer):
    """A vision-language policy's processor around ``tokenizer`` (None for a text model); every call of it gets
    ``data.mm_processor_kwargs``."""
    model = cfg.actor_rollout_ref.model
    return load_processor(model.path, tokenizer=tokenizer, trust_remote_code=model.trust_remote_code,
                          call_kwargs=dict(cfg.data.mm_processor_kwargs))


def model_layout(model_cfg, model: torch.nn.Module, *, key: str, chunked_head: bool = False) -> str:
    """The forward layout a model section's ``use_remove_padding`` / ``use_shared_prompt`` select (shared
    prompts by default), or ``padded`` with one warning when ``model``'s attention cannot keep the
    sequences of a packed row apart; then the guard (:func:`checked_layout`): a layout whose forward differs from
    the model's padded one on a probe falls back to one that agrees, in one warning."""
    layout = forward_layout(use_remove_padding=model_cfg.use_remove_padding,
                            use_shared_prompt=model_cfg.use_shared_prompt)
    if layout != "padded" and is_vision_language(model.config):
        logger.warning("%s: %s is a vision-language model, whose images and 3-D positions go with padded rows; the "
                       "padded layout runs (set %s.use_shared_prompt=False and use_remove_padding=False to choose it)",
                       key, type(model).__name__, key)
        return "padded"
    if layout != "padded" and not supports_segment_attention(model):
        logger.warning("%s: %s does not run its attention through transformers' attention interface, so packed "
                       "rows cannot keep their sequences apart; the padded layout runs (set %s.use_shared_prompt="
                       "False and use_remove_padding=False to choose it)", key, type(model).__name__, key)
        return "padded"
    return checked_layout(model, layout, key=key, chunked_head=chunked_head)


def build_hybrid_engine(dp: DataParallel, *, cfg, total_steps: int, with_rollout: bool = True,
                        with_reference: bool | None = None):
    """Actor (FSDP2-sharded), rollout engine (full weights) and reference of one rank, from a PPOConfig."""
    torch.manual_seed(cfg.trainer.seed)
    arr, device = cfg.actor_rollout_ref, rank_device()
    world, (dp, sp) = dp, split_world(dp, sp_size=arr.actor.ulysses_sequence_parallel_size, device_type=device.type,
                                      key="actor_rollout_ref.actor.ulysses_sequence_parallel_size")
    tokenizer = policy_tokenizer(cfg)
    model = load_policy(cfg, device, gradient_checkpointing=arr.model.enable_gradient_checkpointing)
    layout = model_layout(arr.model, model, key="actor_rollout_ref.model", chunked_head=arr.model.use_fused_kernels)
    if with_reference is None:
        with_reference = reference_enabled(cfg)
    use_lora = arr.model.lora_rank > 0 or bool(arr.model.lora_adapter_path)
    if arr.model.lora_adapter_path:  # continue a trained adapter; rollouts start from the merged weights
        model = load_lora_adapter(model, arr.model.lora_adapter_path)
    # Copies for generation and a separate reference are taken before sharding and LoRA: full, plain weights.
    rollout = rollout_around(merged_copy(model), cfg=cfg, tokenizer=tokenizer) if with_rollout else None
    ref_model = None
    if with_reference and not use_lora:
        ref_model = copy.deepcopy(model).to(resolve_dtype(arr.ref.fsdp_config.model_dtype)).eval()
    if use_lora and not arr.model.lora_adapter_path:
        model = apply_lora(model, rank=arr.model.lora_rank, alpha=arr.model.lora_alpha,
                           target_modules=arr.model.target_modules, exclude_modules=arr.model.exclude_modules)
    if arr.actor.freeze_vision_tower:
        freeze_vision_tower(model)
    model = shard_for_group(model, dp=world, fsdp_cfg=arr.actor.fsdp_config, device=device,
                            precision=training_precision(arr.actor.fsdp_config, arr.model.dtype, device=device))
    split_sequences(model, sp, key="actor_rollout_ref.actor.ulysses_sequence_parallel_size")
    reference = None
    if with_reference:
        reference = _reference_worker(actor_model=model, ref_model=ref_model, arr=arr, dp=dp, device=device,
                                      world=world, sp=sp, layout=layout)
    teacher = build_teacher(cfg, dp=dp, device=device, shard=functools.partial(  # distillation
        shard_for_group, dp=world, fsdp_cfg=arr.ref.fsdp_config, device=device,
        precision=training_precision(arr.ref.fsdp_config, arr.model.dtype, device=device)))
    state = train_state_from_config(model, arr.actor.optim, total_steps=total_steps,
                                    grad_clip=grad_clip_threshold(ACTOR, arr.actor.grad_clip, arr.actor.optim)[0],
                                    offload_optimizer=arr.actor.fsdp_config.optimizer_offload)
    actor = ActorWorker(state=state, schedule=update_schedule(arr.actor, rows_per_prompt=arr.rollout.n, dp=dp),
                        objective=policy_objective(arr.actor, rollout_correction=cfg.algorithm.rollout_correction,
                                                   max_response_length=cfg.data.max_response_length,
                                                   setting=functools.partial(config_value, cfg),
                                                   distillation=distillation_of(cfg)),
                        log_prob=log_prob_batching(arr.rollout, dp), dp=dp, seed=cfg.trainer.seed,
                        layout=layout, use_torch_compile=arr.actor.use_torch_compile,
                        entropy_checkpointing=arr.actor.entropy_checkpointing,
                        calculate_sum_pi_squared=arr.actor.calculate_sum_pi_squared,
                        chunked_head=arr.model.use_fused_kernels)
    checkpoint = FSDPModelComponent(model, state.optimizer, state.scheduler, tokenizer=tokenizer,
                                    save_contents=arr.actor.checkpoint.save_contents,
                                    load_contents=arr.actor.checkpoint.load_contents)
    ref_checkpoint = FSDPModelComponent(reference.model, tokenizer=tokenizer) if ref_model is not None else None
    return HybridEngineWorker(actor=actor, rollout=rollout, reference=reference, checkpoint=checkpoint,
                              reference_checkpoint=ref_checkpoint, teacher=teacher)


def update_schedule(section, *, rows_per_prompt: int, dp: DataParallel):
    """How a trained role's update walks its batch, from its section's verl keys (``ppo_mini_batch_size``,
    ``ppo_epochs``, ``shuffle``, ``ppo_micro_batch_size[_per_gpu]``, ``use_dynamic_bsz``,
    ``ppo_max_token_len_per_gpu``)."""
    return UpdateSchedule(
        mini_batch_size=section.ppo_mini_batch_size, rows_per_prompt=rows_per_prompt, epochs=section.ppo_epochs,
        shuffle=section.shuffle, use_dynamic_bsz=section.use_dynamic_bsz,
        micro_batch_size=per_rank_micro_batch_size(section.ppo_micro_batch_size_per_gpu, section.ppo_micro_batch_size,
                                                   dp.world_size),
        max_token_len=section.ppo_max_token_len_per_gpu)


def policy_objective(actor_cfg, *, rollout_correction, max_response_length: int, setting, distillation=None):
    """The actor's loss from its section's keys; verl's bypass mode (``algorithm.rollout_correction``)
    swaps in the loss that compares pi_theta with the engine's pi_rollout. The loss's own knobs are read
    where its spec says (``policy_loss_spec(name).knobs``; ``setting`` reads a dotted key of the run config)."""
    loss_mode = effective_policy_loss(actor_cfg.policy_loss.loss_mode,
                                      bypass=rollout_correction is not None and rollout_correction.bypass_mode)
    knobs = policy_loss_spec(loss_mode).knob_values(setting)
    return PolicyObjective(
        loss_mode=loss_mode, knobs=knobs, loss_agg_mode=actor_cfg.loss_agg_mode, clip_ratio=actor_cfg.clip_ratio,
        clip_ratio_low=actor_cfg.clip_ratio_low, clip_ratio_high=actor_cfg.clip_ratio_high,
        clip_ratio_c=actor_cfg.clip_ratio_c,
        norm_length=seq_norm_length(actor_cfg.loss_scale_factor, max_response_length), entropy_coeff=actor_cfg.entropy_coeff,
        calculate_entropy=actor_cfg.calculate_entropy, use_kl_loss=actor_cfg.use_kl_loss,
        kl_loss_coef=actor_cfg.kl_loss_coef, kl_loss_type=actor_cfg.kl_loss_type,
        # without a recompute pass the entropy metric comes from the training forward
        report_entropy=actor_cfg.use_rollout_log_probs, distillation=distillation)


def build_rollout_worker(dp: DataParallel, *, cfg):
    """A rollout engine of one rank of a separate rollout pool (split placement): the policy's weights at
    load time, replaced by every weight sync."""
    torch.manual_seed(cfg.trainer.seed)
    model = load_policy(cfg, rank_device())
    return RolloutGroupWorker(rollout=rollout_around(model, cfg=cfg, tokenizer=policy_tokenizer(cfg)))


def load_policy(cfg, device: torch.device, *, gradient_checkpointing: bool = False) -> torch.nn.Module:
    """``actor_rollout_ref.model`` on ``device`` in the actor's parameter dtype (``model.external_lib`` first)."""
    model_cfg = cfg.actor_rollout_ref.model
    import_external_lib(model_cfg.external_lib)
    return load_causal_lm(model_cfg.path, config_path=model_cfg.hf_config_path,
                          dtype=cfg.actor_rollout_ref.actor.fsdp_config.model_dtype,
                          trust_remote_code=model_cfg.trust_remote_code, override_config=dict(model_cfg.override_config),
                          gradient_checkpointing=gradient_checkpointing,
                          attn_implementation=model_cfg.attn_implementation).to(device)


def rollout_around(model: torch.nn.Module, *, cfg, tokenizer):
    """The rollout worker whose engine takes ``model`` over (its private copy; on a CPU in ``rollout.dtype``'s
    choice for this CPU, :func:`~hybridflow.rollout.precision.cpu_engine_dtype`, whatever the training dtype)."""
    model = model.eval()
    if next(model.parameters()).device.type == "cpu":
        model = model.to(cpu_engine_dtype(cfg.actor_rollout_ref.rollout.dtype))
    return _rollout_worker(model, tokenizer, cfg.actor_rollout_ref.rollout,
                           template_kwargs=dict(cfg.data.apply_chat_template_kwargs),
                           processor=policy_processor(cfg, tokenizer))


def log_prob_batching(section, dp: DataParallel):
    """How the rollout's (old log-probs) or the reference's section cuts its no-grad forward:
    verl's ``log_prob_micro_batch_size[_per_gpu]``, ``log_prob_use_dynamic_bsz`` and
    ``log_prob_max_token_len_per_gpu``."""
    size = per_rank_micro_batch_size(section.log_prob_micro_batch_size_per_gpu, section.log_prob_micro_batch_size,
                                     dp.world_size)
    return LogProbBatching(micro_batch_size=size, use_dynamic_bsz=section.log_prob_use_dynamic_bsz,
                           max_token_len=section.log_prob_max_token_len_per_gpu)


def _reference_worker(*, actor_model, ref_model, arr, dp: DataParallel, device: torch.device,
                      world: DataParallel, sp=None, layout: str = "padded"):
    """The reference policy: with LoRA (``ref_model`` None) the actor itself with its adapter off,
    so no second model is held; otherwise the frozen initial copy, sharded like the actor (FSDP2
    over the ``world`` ranks, sequences split over ``sp``)."""


    batching = log_prob_batching(arr.ref, dp)
    kwargs = dict(micro_batch_size=batching.micro_batch_size, use_dynamic_bsz=batching.use_dynamic_bsz,
                  max_token_len=batching.max_token_len, dp=dp, layout=layout,
                  use_torch_compile=arr.ref.use_torch_compile, chunked_head=arr.model.use_fused_kernels)
    if ref_model is None:
        return ReferenceWorker(model=actor_model, adapter_off=functools.partial(disable_adapter, actor_model), **kwargs)
    ref_model = shard_for_group(ref_model, dp=world, fsdp_cfg=arr.ref.fsdp_config, device=device,
                                precision=training_precision(arr.ref.fsdp_config, arr.model.dtype, device=device))
    # The ranks of a sequence-parallel group hold the same rows: at size 1 each runs them whole (redundant, exact).
    ref_sp = sp if arr.ref.ulysses_sequence_parallel_size > 1 else None
    split_sequences(ref_model, ref_sp, key="actor_rollout_ref.ref.ulysses_sequence_parallel_size")
    return ReferenceWorker(model=ref_model, **kwargs)


DEFAULT_PREFIX_CACHE_TOKENS = 32768
"""Tokens of finished turns the native engine keeps for multi-turn prefix reuse (KV bytes = tokens x layers
x 2 x kv_heads x head_dim x 4: 1.5 GB for SmolLM2-135M)."""


def _rollout_worker(engine_model, tokenizer, rollout_cfg, *, template_kwargs=None, processor=None):
    kwargs = engine_kwargs_from_rollout_config(rollout_cfg)
    capabilities = engine_capabilities(rollout_cfg.name)
    if capabilities.owns_model:
        kwargs["own_model"] = True  # engine_model is the engine's private copy: it keeps only the packed weights
    if ("prefix_cache_tokens" in capabilities.sizing_keys and rollout_cfg.multi_turn.enable
            and rollout_cfg.enable_prefix_caching):
        kwargs.setdefault("prefix_cache_tokens", DEFAULT_PREFIX_CACHE_TOKENS)
    engine = build_engine(rollout_cfg.name, engine_model, tokenizer, **kwargs)
    agent_loops = None
    if rollout_cfg.multi_turn.enable:
        agent_loops = build_agent_loop_manager(engine=engine, tokenizer=tokenizer, rollout_cfg=rollout_cfg,
                                               template_kwargs=template_kwargs, processor=processor)
    return RolloutWorker(engine=engine, pad_token_id=tokenizer.pad_token_id, agent_loops=agent_loops,
                         free_cache_engine=rollout_cfg.free_cache_engine)


def build_critic_worker(dp: DataParallel, *, cfg, total_steps: int):
    """The critic of one rank: value model (FSDP2 across the group), optimizer, checkpoint component."""
    torch.manual_seed(cfg.trainer.seed)
    critic_cfg, device = cfg.critic, rank_device()
    world, (dp, sp) = dp, split_world(dp, sp_size=critic_cfg.ulysses_sequence_parallel_size, device_type=device.type,
                                      key="critic.ulysses_sequence_parallel_size")
    import_external_lib(critic_cfg.model.external_lib)
    fsdp_cfg = critic_cfg.model.fsdp_config
    model = load_value_model(critic_cfg.model.path, dtype=fsdp_cfg.model_dtype, trust_remote_code=critic_cfg.model.trust_remote_code,
                             override_config=dict(critic_cfg.model.override_config),
                             config_path=critic_cfg.model.hf_config_path,
                             gradient_checkpointing=critic_cfg.model.enable_gradient_checkpointing).to(device)
    layout = model_layout(critic_cfg.model, model, key="critic.model")
    model = shard_for_group(model, dp=world, fsdp_cfg=fsdp_cfg, device=device,
                            precision=training_precision(fsdp_cfg, device=device))
    split_sequences(model, sp, key="critic.ulysses_sequence_parallel_size")
    state = train_state_from_config(model, critic_cfg.optim, total_steps=total_steps,
                                    grad_clip=grad_clip_threshold("critic", critic_cfg.grad_clip, critic_cfg.optim)[0],
                                    offload_optimizer=fsdp_cfg.optimizer_offload)
    forward = LogProbBatching(
        micro_batch_size=per_rank_micro_batch_size(critic_cfg.forward_micro_batch_size_per_gpu,
                                                   critic_cfg.forward_micro_batch_size, dp.world_size),
        use_dynamic_bsz=critic_cfg.use_dynamic_bsz, max_token_len=critic_cfg.forward_max_token_len_per_gpu)
    objective = ValueObjective(cliprange_value=critic_cfg.cliprange_value, loss_agg_mode=critic_cfg.loss_agg_mode,
                               max_response_length=cfg.data.max_response_length,
                               loss_scale_factor=critic_cfg.loss_scale_factor)
    critic = CriticWorker(state=state, schedule=update_schedule(critic_cfg, rows_per_prompt=critic_cfg.rollout_n, dp=dp),
                          objective=objective, forward=forward, dp=dp, seed=cfg.trainer.seed,
                          layout=layout)
    tokenizer = load_tokenizer(critic_cfg.model.tokenizer_path or critic_cfg.model.path,
                               trust_remote_code=critic_cfg.model.trust_remote_code)
    checkpoint = FSDPModelComponent(model, state.optimizer, state.scheduler, tokenizer=tokenizer,
                                    save_contents=critic_cfg.checkpoint.save_contents,
                                    load_contents=critic_cfg.checkpoint.load_contents)
    return CriticGroupWorker(critic=critic, checkpoint=checkpoint)

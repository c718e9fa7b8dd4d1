"""Factories that build a role's worker inside one rank, from the PPO config.

A factory is ``factory(dp: DataParallel) -> worker``; bind the config with
``functools.partial`` and hand it to ``build_worker_group``. The same function runs in
the local backend (``dp`` = world size 1: no sharding) and in every Ray rank (``dp``
= that rank: FSDP2 across the group), so the two can only differ by the sharding.
"""

from __future__ import annotations

import copy

import torch

from hybridflow.workers.distributed import DataParallel


def rank_device() -> torch.device:
    # Ray sets CUDA_VISIBLE_DEVICES to the rank's GPU, so it is always device 0 of the process.
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def shard_for_group(model: torch.nn.Module, *, dp: DataParallel, fsdp_cfg, device: torch.device) -> torch.nn.Module:
    """FSDP2 over all ranks of the group; unchanged at world size 1 (the local reference)."""
    if dp.world_size == 1:
        return model
    from torch.distributed.device_mesh import init_device_mesh

    from hybridflow.models.fsdp import shard_model

    mesh = init_device_mesh(device.type, (dp.world_size,))
    on_gpu = device.type == "cuda"
    return shard_model(model, mesh=mesh, mixed_precision=fsdp_cfg.mixed_precision if on_gpu else None,
                       param_offload=fsdp_cfg.param_offload or fsdp_cfg.offload_policy,
                       reshard_after_forward=fsdp_cfg.reshard_after_forward)


def model_layout(model_cfg) -> str:
    """The forward layout a model section's ``use_remove_padding`` / ``use_shared_prompt`` select."""
    from hybridflow.workers.logprob import forward_layout

    return forward_layout(use_remove_padding=model_cfg.use_remove_padding,
                          use_shared_prompt=model_cfg.use_shared_prompt)


def build_hybrid_engine(dp: DataParallel, *, cfg, total_steps: int, with_rollout: bool = True,
                        with_reference: bool | None = None):
    """Actor (FSDP2-sharded), rollout engine (full weights) and reference of one rank, from a PPOConfig."""
    from hybridflow.controller.roles import HybridEngineWorker
    from hybridflow.models import load_causal_lm, load_tokenizer
    from hybridflow.models.sharded_checkpoint import FSDPModelComponent
    from hybridflow.workers.actor import ActorWorker
    from hybridflow.workers.optim import train_state_from_config

    torch.manual_seed(cfg.trainer.seed)
    arr, device = cfg.actor_rollout_ref, rank_device()
    tokenizer = load_tokenizer(cfg.data.tokenizer or arr.model.path, trust_remote_code=arr.model.trust_remote_code)
    model = load_causal_lm(arr.model.path, dtype="float32", trust_remote_code=arr.model.trust_remote_code,
                           override_config=dict(arr.model.override_config),
                           gradient_checkpointing=arr.model.enable_gradient_checkpointing,
                           attn_implementation=arr.model.attn_implementation).to(device)
    if with_reference is None:
        with_reference = arr.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward
    use_lora = arr.model.lora_rank > 0
    # Copies for generation and a separate reference are taken before sharding and LoRA: full, plain weights.
    rollout = (_rollout_worker(copy.deepcopy(model).eval(), tokenizer, arr.rollout,
                               template_kwargs=dict(cfg.data.apply_chat_template_kwargs)) if with_rollout else None)
    ref_model = copy.deepcopy(model).eval() if with_reference and not use_lora else None
    if use_lora:
        from hybridflow.models.lora import apply_lora

        model = apply_lora(model, rank=arr.model.lora_rank, alpha=arr.model.lora_alpha,
                           target_modules=arr.model.target_modules, exclude_modules=arr.model.exclude_modules)
    model = shard_for_group(model, dp=dp, fsdp_cfg=arr.actor.fsdp_config, device=device)
    reference = None
    if with_reference:
        reference = _reference_worker(actor_model=model, ref_model=ref_model, arr=arr, dp=dp, device=device)
    state = train_state_from_config(model, arr.actor.optim, grad_clip=arr.actor.grad_clip, total_steps=total_steps)
    actor = ActorWorker(state=state, cfg=arr.actor, rollout_n=arr.rollout.n, max_response_length=cfg.data.max_response_length,
                        log_prob_micro_batch_size=arr.rollout.log_prob_micro_batch_size_per_gpu, dp=dp,
                        seed=cfg.trainer.seed, rollout_correction=cfg.algorithm.rollout_correction,
                        layout=model_layout(arr.model))
    checkpoint = FSDPModelComponent(model, state.optimizer, state.scheduler, tokenizer=tokenizer)
    ref_checkpoint = FSDPModelComponent(reference.model, tokenizer=tokenizer) if ref_model is not None else None
    return HybridEngineWorker(actor=actor, rollout=rollout, reference=reference, checkpoint=checkpoint,
                              reference_checkpoint=ref_checkpoint)


def _reference_worker(*, actor_model, ref_model, arr, dp: DataParallel, device: torch.device):
    """The reference policy: with LoRA (``ref_model`` None) the actor itself with its adapter off,
    so no second model is held; otherwise the frozen initial copy, sharded like the actor."""
    import functools

    from hybridflow.models.lora import disable_adapter
    from hybridflow.workers.reference import ReferenceWorker

    kwargs = dict(micro_batch_size=arr.ref.log_prob_micro_batch_size_per_gpu,
                  use_dynamic_bsz=arr.ref.log_prob_use_dynamic_bsz, max_token_len=arr.ref.log_prob_max_token_len_per_gpu,
                  dp=dp, layout=model_layout(arr.model))
    if ref_model is None:
        return ReferenceWorker(model=actor_model, adapter_off=functools.partial(disable_adapter, actor_model), **kwargs)
    ref_model = shard_for_group(ref_model, dp=dp, fsdp_cfg=arr.ref.fsdp_config, device=device)
    return ReferenceWorker(model=ref_model, **kwargs)


DEFAULT_PREFIX_CACHE_TOKENS = 32768
"""Tokens of finished turns the native engine keeps for multi-turn prefix reuse (KV bytes = tokens x layers
x 2 x kv_heads x head_dim x 4: 1.5 GB for SmolLM2-135M)."""


def _rollout_worker(engine_model, tokenizer, rollout_cfg, *, template_kwargs=None):
    from hybridflow.rollout.config import engine_kwargs_from_rollout_config
    from hybridflow.rollout.engine import build_engine
    from hybridflow.workers.rollout import RolloutWorker

    kwargs = engine_kwargs_from_rollout_config(rollout_cfg)
    if rollout_cfg.name == "native" and rollout_cfg.multi_turn.enable and rollout_cfg.enable_prefix_caching:
        kwargs.setdefault("prefix_cache_tokens", DEFAULT_PREFIX_CACHE_TOKENS)
    engine = build_engine(rollout_cfg.name, engine_model, tokenizer, **kwargs)
    agent_loops = None
    if rollout_cfg.multi_turn.enable:
        from hybridflow.agents.manager import build_agent_loop_manager

        agent_loops = build_agent_loop_manager(engine=engine, tokenizer=tokenizer, rollout_cfg=rollout_cfg,
                                               template_kwargs=template_kwargs)
    return RolloutWorker(engine=engine, pad_token_id=tokenizer.pad_token_id, agent_loops=agent_loops)


def build_critic_worker(dp: DataParallel, *, cfg, total_steps: int):
    """The critic of one rank: value model (FSDP2 across the group), optimizer, checkpoint component."""
    from hybridflow.controller.roles import CriticGroupWorker
    from hybridflow.models import load_tokenizer, load_value_model
    from hybridflow.models.sharded_checkpoint import FSDPModelComponent
    from hybridflow.workers.critic import CriticWorker
    from hybridflow.workers.optim import train_state_from_config

    torch.manual_seed(cfg.trainer.seed)
    critic_cfg, device = cfg.critic, rank_device()
    model = load_value_model(critic_cfg.model.path, dtype="float32", trust_remote_code=critic_cfg.model.trust_remote_code,
                             override_config=dict(critic_cfg.model.override_config)).to(device)
    model = shard_for_group(model, dp=dp, fsdp_cfg=critic_cfg.model.fsdp_config, device=device)
    state = train_state_from_config(model, critic_cfg.optim, grad_clip=critic_cfg.grad_clip, total_steps=total_steps)
    critic = CriticWorker(state=state, cfg=critic_cfg, rollout_n=cfg.actor_rollout_ref.rollout.n, dp=dp,
                          max_response_length=cfg.data.max_response_length, layout=model_layout(critic_cfg.model))
    tokenizer = load_tokenizer(critic_cfg.model.tokenizer_path or critic_cfg.model.path,
                               trust_remote_code=critic_cfg.model.trust_remote_code)
    return CriticGroupWorker(critic=critic, checkpoint=FSDPModelComponent(model, state.optimizer, state.scheduler,
                                                                         tokenizer=tokenizer))

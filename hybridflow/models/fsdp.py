"""FSDP2 (``torch.distributed.fsdp.fully_shard``) for the actor, reference and critic.

Every decoder layer becomes one FSDP unit (the classes the model lists in ``_no_split_modules``, as
verl's default wrap policy, or ``wrap_policy.transformer_layer_cls_to_wrap``), then the root (embeddings, final norm,
head): a layer's parameters are all-gathered just before its forward/backward and
freed after, so a rank holds ``1/N`` of the weights, gradients and Adam state plus one
layer in full (ZeRO-3; Rajbhandari et al., "ZeRO", SC 2020; Zhao et al., "PyTorch FSDP",
VLDB 2023). Gradients are reduce-scattered as the *mean* over ranks, which is why the
workers multiply their globally-normalised losses by the world size.

Precision (:func:`resolve_precision`): verl's ``mixed_precision`` mapping (``param_dtype`` / ``reduce_dtype``) or a
dtype name computes in that dtype with the master weights in ``model_dtype`` (fp32): FSDP2's
``MixedPrecisionPolicy`` when sharded, autocast around the forward on a single process. Unset, a GPU computes in
bf16 as verl does, a CPU with AVX-512-BF16 / AMX too (``hybridflow.cpu.cpu_has_bf16``), any other CPU in the
parameter dtype (fp32), where bf16 matmuls are far slower (docs/configuration.md has numbers). ``param_offload`` keeps the sharded parameters, gradients
and optimizer state in CPU memory between uses (``CPUOffloadPolicy``); ``optimizer_offload``
keeps only the optimizer state there between steps. ``fsdp_size`` < world size shards inside
groups of that size and replicates across them (HSDP, a 2-D mesh).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

from hybridflow.cpu import cpu_has_bf16, cpu_precision_reason
from hybridflow.errors import ConfigError
from hybridflow.models.fused_norms import fuse_norms_and_swiglu
from hybridflow.models.fused_projections import fuse_sibling_projections
from hybridflow.models.fused_rotary import fuse_rotary

logger = logging.getLogger(__name__)

COMPUTE_DTYPES = {"fp32": None, "float32": None, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
                  "fp16": torch.float16, "float16": torch.float16}
"""Names accepted for a compute dtype -> the dtype (None: no mixed precision)."""


def compute_dtype(*choices: str | None) -> torch.dtype | None:
    """The first choice that is set (``fsdp_config.mixed_precision``, then ``model.dtype``) as a dtype;
    None when none is set or it is fp32 (compute in the parameters' dtype)."""
    for choice in choices:
        if choice is not None:
            if choice not in COMPUTE_DTYPES:
                raise ConfigError(f"mixed precision {choice!r} is not one of {', '.join(COMPUTE_DTYPES)} or null")
            return COMPUTE_DTYPES[choice]
    return None


@dataclass(frozen=True)
class Precision:
    """How a trained model computes: ``param_dtype`` is the dtype its layers run in (None: the weights' own,
    no mixed precision), ``reduce_dtype`` the dtype FSDP2 reduces gradients in."""

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype = torch.float32


MIXED_PRECISION_KEYS = ("param_dtype", "reduce_dtype", "buffer_dtype")
_warned_buffer_dtype: set[str] = set()


def resolve_precision(mixed_precision: Any, *, fallback: str | None = None, device_type: str = "cpu") -> Precision:
    """verl's ``fsdp_config.mixed_precision``: a mapping ``{param_dtype: bf16, reduce_dtype: fp32, buffer_dtype:
    fp32}`` (each defaulting to that, as verl's FSDP engine) or a dtype name (the compute dtype). Unset, ``fallback``
    (``model.dtype``) decides, else the device: bf16 over the weights on a GPU, as verl; on a CPU bf16 where it has
    AVX-512-BF16 / AMX, else the weights' own dtype (bf16 matmuls are 27-160x slower there; docs/configuration.md)."""
    if isinstance(mixed_precision, Mapping):
        unknown = sorted(set(mixed_precision) - set(MIXED_PRECISION_KEYS))
        if unknown:
            raise ConfigError(f"fsdp_config.mixed_precision has no key {unknown[0]!r}; it takes "
                              f"{', '.join(MIXED_PRECISION_KEYS)}")
        _note_buffer_dtype(mixed_precision.get("buffer_dtype", "fp32"))
        reduce = compute_dtype(mixed_precision.get("reduce_dtype", "fp32")) or torch.float32
        return Precision(compute_dtype(mixed_precision.get("param_dtype", "bf16")), reduce)
    if mixed_precision is not None or fallback is not None:
        return Precision(compute_dtype(mixed_precision, fallback))
    if device_type == "cpu":
        return cpu_default_precision()
    return Precision(torch.bfloat16 if device_type == "cuda" else None)


def cpu_default_precision() -> Precision:
    """The CPU's automatic choice : bf16 compute over fp32 master weights where the CPU has bf16 units
    (AVX-512-BF16 / AMX: bf16 matmuls 2-5x fp32's), fp32 where it has not; said in one line per process."""
    bf16 = cpu_has_bf16()
    _say_cpu_precision(bf16, cpu_precision_reason())
    return Precision(torch.bfloat16 if bf16 else None)


@functools.cache
def _say_cpu_precision(bf16: bool, reason: str) -> None:
    if bf16:
        logger.warning("hybridflow: CPU training computes in bf16 with fp32 master weights and reductions (%s); "
                       "fsdp_config.mixed_precision=fp32 computes in fp32", reason)
    else:
        logger.warning("hybridflow: CPU training computes in fp32 (%s); fsdp_config.mixed_precision=bf16 computes "
                       "in bf16", reason)


def _note_buffer_dtype(name: str) -> None:
    """FSDP2 has no buffer dtype (verl's fsdp2 strategy ignores it too): a non-fp32 one is said once."""
    if compute_dtype(name) is not None and name not in _warned_buffer_dtype:
        _warned_buffer_dtype.add(name)
        logger.warning("hybridflow: fsdp_config.mixed_precision.buffer_dtype=%s has no effect: buffers stay in "
                       "fsdp_config.model_dtype (FSDP2 casts parameters only, as in verl's fsdp2 strategy)", name)


def autocast_forward(model: torch.nn.Module, *, device_type: str, dtype: torch.dtype | None) -> torch.nn.Module:
    """Run ``model``'s forward under autocast to ``dtype`` (mixed precision of an unsharded model:
    the weights stay in their dtype, matmuls run in ``dtype``; q / k / v and gate / up each one matmul,
    hybridflow.models.fused_projections; the rotary embedding one autograd function, hybridflow.models.fused_rotary;
    on a CPU, RMSNorms and SwiGLU products as autograd functions, hybridflow.models.fused_norms); no-op for None."""
    if dtype is not None:
        fuse_sibling_projections(model)
        fuse_rotary(model)
        if device_type == "cpu":
            fuse_norms_and_swiglu(model, dtype=dtype)
        model.forward = torch.autocast(device_type=device_type, dtype=dtype)(model.forward)
    return model


def data_parallel_mesh(device_type: str, world_size: int, fsdp_size: int = -1):
    """1-D mesh over all ranks, or with ``fsdp_size`` in (1, world) a 2-D (replicate, shard) mesh:
    HSDP, parameters sharded inside each group of ``fsdp_size`` ranks and replicated across groups."""
    from torch.distributed.device_mesh import init_device_mesh

    if fsdp_size <= 0 or fsdp_size >= world_size:
        return init_device_mesh(device_type, (world_size,))
    if world_size % fsdp_size:
        raise ConfigError(f"fsdp_config.fsdp_size={fsdp_size} does not divide the {world_size} data-parallel ranks")
    return init_device_mesh(device_type, (world_size // fsdp_size, fsdp_size), mesh_dim_names=("replicate", "shard"))


def layer_classes(model: torch.nn.Module) -> list[str]:
    """The class names of the model's repeated blocks as transformers declares them (``_no_split_modules`` of
    every ``PreTrainedModel`` inside ``model``: ``LlamaDecoderLayer``, ``Gemma2DecoderLayer``,
    ``MixtralDecoderLayer``, ...), in order, without repeats."""
    names: dict[str, None] = {}
    for module in model.modules():
        names.update(dict.fromkeys(getattr(module, "_no_split_modules", None) or []))
    return list(names)


def decoder_layers(model: torch.nn.Module, classes: list[str] | None = None) -> list[torch.nn.Module]:
    """The modules FSDP2 shards one by one, innermost first: instances of ``classes`` (verl's
    ``wrap_policy.transformer_layer_cls_to_wrap``; default :func:`layer_classes`), else every child of a
    ``ModuleList`` named ``layers`` or ``h``."""
    wanted = set(classes or layer_classes(model))
    found = [module for module in model.modules() if type(module).__name__ in wanted]
    if classes and not found:
        present = sorted({type(module).__name__ for module in model.modules()})
        raise ConfigError(f"fsdp_config.wrap_policy.transformer_layer_cls_to_wrap={list(classes)} names no module "
                          f"of this model; its classes: {', '.join(present)}")
    if found:
        return found[::-1]  # descendants before ancestors: fully_shard a nested unit before its parent
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and name.rsplit(".", 1)[-1] in ("layers", "h"):
            return list(module)
    return []


def shard_model(model: torch.nn.Module, *, mesh=None, precision: Precision = Precision(),
                param_offload: bool = False, reshard_after_forward: bool = True,
                layer_classes_to_wrap: list[str] | None = None) -> torch.nn.Module:
    """``fully_shard`` each decoder layer (:func:`decoder_layers`), then the root; returns the same (now sharded)
    module.

    ``mesh``: a 1-D ``DeviceMesh`` over the data-parallel ranks (None = the default group) or a
    2-D (replicate, shard) one for HSDP (``data_parallel_mesh``).
    """
    kwargs = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if precision.param_dtype is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=precision.param_dtype,
                                                   reduce_dtype=precision.reduce_dtype)
    if param_offload:
        # Pinned memory needs a GPU; on CPU the "offload" is the resting place of the shards anyway.
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    for layer in decoder_layers(model, layer_classes_to_wrap):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded weights by HF name, on CPU, on every rank (a collective: call it on all ranks).

    Used to push weights into the rollout engine (in memory, no disk) and for HF export.
    """
    if not is_sharded(model):
        return {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
    # cpu_offload=True would keep the gathered tensors on rank 0 only; every colocated
    # rollout engine needs them, so gather on all ranks and move to CPU here.
    gathered = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=False))
    return {name: tensor.detach().cpu() for name, tensor in gathered.items()}


def set_gradient_sync(model: torch.nn.Module, enabled: bool) -> None:
    """Turn the gradient reduce-scatter on/off (off = accumulate locally, unsharded)."""
    if is_sharded(model):
        model.set_requires_gradient_sync(enabled)


@contextlib.contextmanager
def micro_batch_sync(model: torch.nn.Module, *, index: int, count: int) -> Iterator[None]:
    """Gradient accumulation without extra syncs: reduce only in the backward of the last micro-batch.

    ``for i, micro in enumerate(micros): with micro_batch_sync(model, index=i, count=len(micros)): backward``
    does one reduce-scatter per optimizer step instead of one per micro-batch.
    """
    set_gradient_sync(model, index == count - 1)
    try:
        yield
    finally:
        set_gradient_sync(model, True)

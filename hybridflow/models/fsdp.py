"""FSDP2 (``torch.distributed.fsdp.fully_shard``) for the actor, reference and critic.

Every decoder layer becomes one FSDP unit, then the root (embeddings, final norm,
head): a layer's parameters are all-gathered just before its forward/backward and
freed after, so a rank holds ``1/N`` of the weights, gradients and Adam state plus one
layer in full (ZeRO-3; Rajbhandari et al., "ZeRO", SC 2020; Zhao et al., "PyTorch FSDP",
VLDB 2023). Gradients are reduce-scattered as the *mean* over ranks, which is why the
workers multiply their globally-normalised losses by the world size.

Precision: on GPU ``mixed_precision="bf16"`` computes in bf16 with fp32 master weights
and fp32 gradient reduction; on CPU everything stays fp32 (bf16 matmuls are far slower
there). ``param_offload`` keeps the sharded parameters, gradients and optimizer state in
CPU memory between uses (``CPUOffloadPolicy``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

from hybridflow.errors import ConfigError

PRECISIONS = {
    None: None,
    "fp32": None,
    "bf16": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
}


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks: every child of a ``ModuleList`` named ``layers`` or ``h``."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and name.rsplit(".", 1)[-1] in ("layers", "h"):
            return list(module)
    return []


def shard_model(model: torch.nn.Module, *, mesh=None, mixed_precision: str | None = None,
                param_offload: bool = False, reshard_after_forward: bool = True) -> torch.nn.Module:
    """``fully_shard`` each decoder layer, then the root; returns the same (now sharded) module.

    ``mesh``: a 1-D ``DeviceMesh`` over the data-parallel ranks (None = the default group).
    """
    if mixed_precision not in PRECISIONS:
        raise ConfigError(f"fsdp_config.mixed_precision={mixed_precision!r}; use one of bf16, fp32 or null")
    kwargs = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if PRECISIONS[mixed_precision] is not None:
        kwargs["mp_policy"] = PRECISIONS[mixed_precision]
    if param_offload:
        # Pinned memory needs a GPU; on CPU the "offload" is the resting place of the shards anyway.
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    for layer in decoder_layers(model):
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

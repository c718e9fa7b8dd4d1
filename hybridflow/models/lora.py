"""LoRA adapters through peft: apply, switch off, merge, save and load.

LoRA (Hu et al. 2021, arXiv:2106.09685) freezes a pretrained weight ``W [out, in]`` and
learns a low-rank update, so a targeted linear layer computes

    h = W x + (alpha / r) * B A x,     A [r, in], B [out, r], B initialised to 0

Only ``A`` and ``B`` train. Two consequences the trainers use:

* the reference policy of RL is the same module with the update switched off
  (:func:`disable_adapter`), so no second copy of the model is held;
* export folds the update into ``W`` (:func:`merge_lora`), giving a plain HF model.

Adapter checkpoints (:func:`save_adapter` / :func:`load_adapter`) hold ``A`` and ``B``
only, in peft's format (``adapter_config.json`` + ``adapter_model.safetensors``), which
``peft.PeftModel.from_pretrained`` also reads.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator, Mapping, Sequence

import torch

from hybridflow.errors import ConfigError, ModelError

ALL_LINEAR = "all-linear"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def apply_lora(model: torch.nn.Module, *, rank: int, alpha: float, target_modules: str | Sequence[str] = ALL_LINEAR,
               exclude_modules: Sequence[str] | None = None):
    """Wrap ``model`` in a ``PeftModel`` with LoRA of ``rank`` on ``target_modules``; only A and B train.

    ``target_modules`` is ``'all-linear'`` (every linear layer except the output head) or
    a list of module-name suffixes such as ``['q_proj', 'v_proj']``.
    """
    from peft import LoraConfig, get_peft_model

    if rank <= 0:
        raise ConfigError(f"LoRA rank must be positive, got {rank}; set model.lora_rank >= 1 (0 disables LoRA)")
    targets = target_modules if isinstance(target_modules, str) else list(target_modules)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, bias="none", task_type="CAUSAL_LM",
                        exclude_modules=list(exclude_modules) if exclude_modules else None)
    try:
        return get_peft_model(model, config)
    except ValueError as err:  # peft's message for targets that match no module
        raise ConfigError(f"LoRA target_modules={targets!r} do not fit this model ({str(err).splitlines()[0]}); "
                          "use 'all-linear' or names such as [q_proj, v_proj]") from err


def load_lora_adapter(model: torch.nn.Module, path: str):
    """``model`` with the trained LoRA adapter saved at ``path`` (a peft folder), trainable (issue 60: verl's
    ``model.lora_adapter_path``)."""
    from peft import PeftModel

    if not os.path.isfile(os.path.join(os.path.expanduser(path), "adapter_config.json")):
        raise ConfigError(f"model.lora_adapter_path='{path}' holds no adapter_config.json: point it at a folder "
                          "saved by peft's save_pretrained")
    return PeftModel.from_pretrained(model, os.path.expanduser(path), is_trainable=True)


def merged_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A plain copy of ``model`` with any LoRA adapter merged into the base weights (the rollout engine's weights)."""
    copied = copy.deepcopy(model)
    return merge_lora(copied) if is_lora_model(copied) else copied


def is_lora_model(model: torch.nn.Module) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def _require_lora(model: torch.nn.Module, what: str) -> None:
    if not is_lora_model(model):
        raise ModelError(f"{what} needs a LoRA model (from apply_lora), got {type(model).__name__}")


@contextlib.contextmanager
def disable_adapter(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Inside the block ``model`` computes the base model exactly (the RL reference policy)."""
    _require_lora(model, "disable_adapter")
    with model.disable_adapter():
        yield model


def merge_lora(model: torch.nn.Module) -> torch.nn.Module:
    """Fold every ``(alpha / r) B A`` into its ``W`` and return the plain HF model (``model`` is consumed)."""
    _require_lora(model, "merge_lora")
    return model.merge_and_unload()


def save_adapter(model: torch.nn.Module, directory: str, *,
                 state_dict: Mapping[str, torch.Tensor] | None = None) -> str:
    """Write the adapter only, in peft's format; ``state_dict`` overrides the weights (e.g. gathered from FSDP)."""
    _require_lora(model, "save_adapter")
    extra = {"state_dict": dict(state_dict)} if state_dict is not None else {}
    model.save_pretrained(directory, safe_serialization=True, **extra)
    return directory


def load_adapter(model: torch.nn.Module, directory: str) -> torch.nn.Module:
    """Load adapter weights written by :func:`save_adapter` into the LoRA model ``model`` (same rank/targets)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    _require_lora(model, "load_adapter")
    path = os.path.join(directory, ADAPTER_WEIGHTS)
    if not os.path.isfile(path):
        raise ModelError(f"{directory} has no {ADAPTER_WEIGHTS}; point at a folder written by save_adapter")
    result = set_peft_model_state_dict(model, load_file(path))
    lora_missing = [key for key in result.missing_keys if "lora_" in key]
    if lora_missing:
        raise ModelError(f"adapter in {directory} lacks {len(lora_missing)} LoRA weights (e.g. {lora_missing[0]}); "
                         "it was saved with another lora_rank or target_modules")
    return model


def trainable_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """``{name: parameter}`` of the parameters that receive gradients."""
    return {name: param for name, param in model.named_parameters() if param.requires_grad}


def lora_scaling(model: torch.nn.Module) -> float:
    """alpha / r of the ``default`` adapter (the factor in h = W x + (alpha / r) B A x)."""
    config = model.peft_config["default"]
    return config.lora_alpha / config.r


def hf_name(peft_name: str) -> str:
    """``base_model.model.model.layers.0.q_proj.base_layer.weight`` -> ``model.layers.0.q_proj.weight``."""
    return peft_name.removeprefix("base_model.model.").replace(".base_layer.", ".")


def merged_state_dict(state: Mapping[str, torch.Tensor], *, scaling: float) -> dict[str, torch.Tensor]:
    """A LoRA model's full state (peft names) as plain HF weights with W + scaling * B A folded in.

    Works on a gathered FSDP state too, so the rollout engine of an RL run with LoRA gets
    merged weights without a second model in memory: ``W`` is never modified in place.
    """
    unsupported = sorted(name for name in state if ".lora_embedding_" in name or ".lora_magnitude_" in name)
    if unsupported:  # only Linear LoRA is folded here; anything else would be dropped silently
        raise ModelError(f"cannot fold LoRA weights such as {unsupported[0]!r} into plain weights; "
                         "target only linear layers (model.target_modules)")
    merged = {hf_name(name): tensor for name, tensor in state.items() if ".lora_" not in name}
    suffix = ".lora_A.default.weight"
    for name, lora_a in state.items():
        if name.endswith(suffix):
            prefix = name[: -len(suffix)]
            lora_b = state[f"{prefix}.lora_B.default.weight"]
            base = state[f"{prefix}.base_layer.weight"]
            merged[hf_name(f"{prefix}.weight")] = base + scaling * (lora_b.to(base.dtype) @ lora_a.to(base.dtype))
    return merged

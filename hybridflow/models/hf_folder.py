"""HuggingFace folders: write one from a model, and merge a checkpoint's weights into one.

A checkpoint component directory (``global_step_N/actor``) holds the trained weights
(``model.safetensors``, or DCP shards in ``dcp/``) and a ``huggingface/`` folder with the
config, generation config and tokenizer files. For a LoRA model that folder also holds
peft's ``adapter_config.json``: the weights were saved with the LoRA structure, and the
merger needs it to rebuild that structure before it can load them.
:func:`merge_into_hf_folder` is the merge both checkpoint layouts share; it gives a
folder that ``AutoModelForCausalLM.from_pretrained`` loads.
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
from collections.abc import Callable

import torch

from hybridflow.models.loader import auto_model_class
from hybridflow.models.lora import is_lora_model, merge_lora
from hybridflow.models.vision import PROCESSOR_FILES

HF_FOLDER = "huggingface"
LORA_FOLDER = "lora_adapter"  # SFT runs with LoRA: the adapter alone, in peft's format
ADAPTER_CONFIG = "adapter_config.json"


def has_hf_config(model: torch.nn.Module) -> bool:
    """Whether ``model`` carries an HF config that can describe it in a ``huggingface/`` folder."""
    return hasattr(getattr(model, "config", None), "save_pretrained")


def _save_config_files(model: torch.nn.Module, out_dir: str) -> None:
    model.config.save_pretrained(out_dir)
    if is_lora_model(model):  # the merger rebuilds the LoRA structure from it to load the saved weights
        model.peft_config["default"].save_pretrained(out_dir)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out_dir)


def save_hf_folder(model: torch.nn.Module, tokenizer, out_dir: str, *, include_weights: bool = True) -> str:
    """Write config, generation config, tokenizer files and, if ``include_weights``, safetensors weights.

    Without weights, a LoRA model also writes ``adapter_config.json``. With weights, ``model``
    must be a plain HF model (LoRA merged in): the folder then is a complete model, so an
    ``adapter_config.json`` left by an earlier metadata-only save is removed (beside full
    weights it would make ``from_pretrained`` look for adapter weights instead).
    """
    os.makedirs(out_dir, exist_ok=True)
    if include_weights:
        model.save_pretrained(out_dir)  # safetensors; tied weights stored once, as transformers expects
        stale_adapter_config = os.path.join(out_dir, ADAPTER_CONFIG)
        if os.path.isfile(stale_adapter_config):
            os.remove(stale_adapter_config)
    else:
        _save_config_files(model, out_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
        copy_processor_files(getattr(tokenizer, "name_or_path", ""), out_dir)
    return out_dir


def copy_processor_files(source_dir: str, out_dir: str) -> None:
    """A vision-language model's image-processor files, from the folder it was loaded from (no-op for a text
    model's folder): the saved folder then loads with its processor again."""
    for name in PROCESSOR_FILES:
        source = os.path.join(os.path.expanduser(str(source_dir)), name)
        if os.path.isfile(source) and os.path.abspath(source) != os.path.abspath(os.path.join(out_dir, name)):
            os.makedirs(out_dir, exist_ok=True)
            shutil.copyfile(source, os.path.join(out_dir, name))


def _adapter_config_dir(local_dir: str) -> str | None:
    """Where the LoRA structure of ``local_dir``'s weights is described; None for a plain model.

    ``huggingface/`` unless a merged export replaced it with a plain model; then an SFT
    run's ``lora_adapter/`` still has it.
    """
    for folder in (HF_FOLDER, LORA_FOLDER):
        if os.path.isfile(os.path.join(local_dir, folder, ADAPTER_CONFIG)):
            return os.path.join(local_dir, folder)
    return None


def plain_causal_lm(
    config, *, lora_config, load_weights: Callable[[torch.nn.Module], None], dtype: torch.dtype | None = None,
    on_meta: bool = False,
) -> torch.nn.Module:
    """The plain ``*ForCausalLM`` that ``config`` describes, holding saved weights with LoRA folded in.

    The weights were saved under the LoRA structure ``lora_config`` describes (None: a plain
    model); ``load_weights(model)`` loads them in place into a model of that structure.
    ``on_meta`` builds it on the meta device, for a ``load_weights`` that assigns existing
    tensors (``load_state_dict(..., assign=True)``): no second copy of the weights.
    """
    dtype_kwargs = {} if dtype is None else {"dtype": dtype}
    with torch.device("meta") if on_meta else contextlib.nullcontext():
        model = auto_model_class(config).from_config(config, **dtype_kwargs)
        if lora_config is not None:
            from peft import get_peft_model

            model = get_peft_model(model, lora_config)
    load_weights(model)
    return merge_lora(model) if lora_config is not None else model


def merge_into_hf_folder(
    local_dir: str, target_dir: str, *, dtype: torch.dtype, load_weights: Callable[[torch.nn.Module], None]
) -> str:
    """Build the model ``{local_dir}/huggingface`` describes, fill it, fold LoRA in, write ``target_dir``.

    ``load_weights(model)`` loads the saved weights in place (they carry LoRA names when the
    run used LoRA); the generation config and tokenizer files are copied when present.
    """
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    hf_dir = os.path.join(local_dir, HF_FOLDER)
    adapter_dir = _adapter_config_dir(local_dir)
    lora_config = None
    if adapter_dir is not None:
        from peft import LoraConfig

        lora_config = LoraConfig.from_pretrained(adapter_dir)
    model = plain_causal_lm(AutoConfig.from_pretrained(hf_dir), lora_config=lora_config, load_weights=load_weights,
                            dtype=dtype)
    if os.path.isfile(os.path.join(hf_dir, "generation_config.json")):
        model.generation_config = GenerationConfig.from_pretrained(hf_dir)
    has_tokenizer = os.path.isfile(os.path.join(hf_dir, "tokenizer_config.json"))
    tokenizer = AutoTokenizer.from_pretrained(hf_dir) if has_tokenizer else None
    copy_processor_files(hf_dir, target_dir)
    return save_hf_folder(model, tokenizer, target_dir)


def plain_hf_model(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A plain ``*ForCausalLM`` holding ``state`` (LoRA merged in), built on the meta device: no copy of the weights.

    Works for a sharded model too: ``state`` is its gathered full state dict, ``model`` only supplies the structure.
    """
    lora_config = copy.deepcopy(model.peft_config["default"]) if is_lora_model(model) else None
    if lora_config is not None:
        # merging adds B A into W in place, and an unsharded model's state shares storage with its live weights
        state = {name: tensor.clone() for name, tensor in state.items()}
    plain = plain_causal_lm(model.config, lora_config=lora_config, on_meta=True,
                            load_weights=lambda clone: clone.load_state_dict(state, strict=True, assign=True))
    plain.tie_weights()  # a gathered state holds tied weights as two tensors; the export stores them once
    plain.generation_config = copy.deepcopy(model.generation_config)
    return plain

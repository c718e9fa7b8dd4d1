"""HuggingFace folders from training state: the ``huggingface/`` folder and the model merger.

An actor checkpoint directory holds ``model.safetensors`` (the trained weights) and a
``huggingface/`` folder with the config, generation config and tokenizer files.
:func:`merge_checkpoint` turns such a directory into a folder that
``AutoModelForCausalLM.from_pretrained`` loads; it backs
``python -m hybridflow.model_merger merge --backend fsdp --local_dir .../actor --target_dir DIR``.
"""

from __future__ import annotations

import os

import torch
from safetensors import safe_open
from safetensors.torch import load_model

from hybridflow.errors import ModelError

WEIGHTS_FILE = "model.safetensors"
HF_FOLDER = "huggingface"


def save_hf_folder(model, tokenizer, out_dir: str, include_weights: bool = True) -> str:
    """Write config, generation config, tokenizer files and, if ``include_weights``, safetensors weights."""
    os.makedirs(out_dir, exist_ok=True)
    if include_weights:
        model.save_pretrained(out_dir)  # safetensors; tied weights stored once, as transformers expects
    else:
        model.config.save_pretrained(out_dir)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(out_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    return out_dir


_FLOAT_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def _stored_dtype(weights_path: str) -> torch.dtype:
    """The dtype of the first floating tensor in a safetensors file (the merged model keeps it)."""
    with safe_open(weights_path, framework="pt") as f:
        for name in f.keys():
            stored = f.get_slice(name).get_dtype()
            if stored in _FLOAT_DTYPES:
                return _FLOAT_DTYPES[stored]
    return torch.float32


def merge_checkpoint(local_dir: str, target_dir: str) -> str:
    """Combine ``{local_dir}/model.safetensors`` with ``{local_dir}/huggingface/`` into a loadable HF folder."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    weights, hf_dir = os.path.join(local_dir, WEIGHTS_FILE), os.path.join(local_dir, HF_FOLDER)
    if not os.path.isfile(weights) or not os.path.isfile(os.path.join(hf_dir, "config.json")):
        raise ModelError(
            f"{local_dir} is not an actor checkpoint (needs {WEIGHTS_FILE} and {HF_FOLDER}/config.json); "
            "pass --local_dir {default_local_dir}/global_step_N/actor"
        )
    config = AutoConfig.from_pretrained(hf_dir)
    model = AutoModelForCausalLM.from_config(config, dtype=_stored_dtype(weights))
    load_model(model, weights, strict=True)
    if os.path.isfile(os.path.join(hf_dir, "generation_config.json")):
        model.generation_config = GenerationConfig.from_pretrained(hf_dir)
    has_tokenizer = os.path.isfile(os.path.join(hf_dir, "tokenizer_config.json"))
    tokenizer = AutoTokenizer.from_pretrained(hf_dir) if has_tokenizer else None
    return save_hf_folder(model, tokenizer, target_dir, include_weights=True)

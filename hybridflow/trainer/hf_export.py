"""The model merger for single-file checkpoints (``model.safetensors`` + ``huggingface/``).

An actor checkpoint directory written by ``ModelComponent`` holds ``model.safetensors``
(the trained weights) and a ``huggingface/`` folder with the config, generation config
and tokenizer files. :func:`merge_checkpoint` turns such a directory into a folder that
``AutoModelForCausalLM.from_pretrained`` loads; it backs
``python -m hybridflow.model_merger merge --backend fsdp --local_dir .../actor --target_dir DIR``.
The folder writing and the merge itself are ``hybridflow.models.hf_folder``'s, shared
with the sharded (DCP) layout.
"""

from __future__ import annotations

import os

import torch
from safetensors import safe_open
from safetensors.torch import load_model

from hybridflow.errors import ModelError
from hybridflow.models.hf_folder import HF_FOLDER, merge_into_hf_folder

WEIGHTS_FILE = "model.safetensors"

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
    weights = os.path.join(local_dir, WEIGHTS_FILE)
    if not os.path.isfile(weights) or not os.path.isfile(os.path.join(local_dir, HF_FOLDER, "config.json")):
        raise ModelError(
            f"{local_dir} is not an actor checkpoint (needs {WEIGHTS_FILE} and {HF_FOLDER}/config.json); "
            "pass --local_dir {default_local_dir}/global_step_N/actor"
        )
    return merge_into_hf_folder(local_dir, target_dir, dtype=_stored_dtype(weights),
                                load_weights=lambda model: load_model(model, weights, strict=True))

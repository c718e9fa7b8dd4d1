"""Load HF causal LMs and tokenizers by local path or hub id (``actor_rollout_ref.model.path``).

One set of path rules for every model role: a local folder is used as is; anything
else is treated as a hub id, and a failure to resolve it becomes a ``ModelError`` that
names the path and the two ways to get a model without a hub.
"""

from __future__ import annotations

import importlib
import json
import os
import struct

import torch

from hybridflow.errors import ConfigError, ModelError

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``'bf16'`` / ``'bfloat16'`` / ``torch.bfloat16`` -> ``torch.bfloat16`` (and so on)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def _missing_model(path: str, cause: Exception) -> ModelError:
    return ModelError(
        f"cannot load a model from {path!r} ({type(cause).__name__}); pass an existing HF folder, "
        f"make a test model with `hybridflow models tiny DIR`, fetch the default with "
        f"`hybridflow models fetch smollm2-135m-instruct`, or use a hub id where a hub is reachable"
    )


_REFETCH = (
    "copy or export the model again (`hybridflow models tiny DIR` makes a test model, "
    "`hybridflow models fetch smollm2-135m-instruct` the default one)"
)


def safetensors_problem(path: str) -> str | None:
    """Why the safetensors file at ``path`` cannot be loaded (truncated, not safetensors), else None.

    Reads only the header: 8 bytes of little-endian header length, the JSON header, and
    the file size, which must equal 8 + header + the end of the last tensor's data.
    """
    size = os.path.getsize(path)
    try:
        with open(path, "rb") as handle:
            (header_len,) = struct.unpack("<Q", handle.read(8))
            if header_len > size - 8:
                return f"truncated: {size} bytes, but its header alone claims {header_len}"
            header = json.loads(handle.read(header_len))
    except (struct.error, ValueError, UnicodeDecodeError) as error:
        return f"not a safetensors file ({type(error).__name__})"
    ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
    expected = 8 + header_len + max(ends, default=0)
    if size != expected:
        return f"{'truncated' if size < expected else 'corrupt'}: {size} bytes, its header says {expected}"
    return None


def check_model_folder(path: str) -> None:
    """One clear error for an empty folder or a damaged ``*.safetensors`` file in it."""
    entries = os.listdir(path)
    if not entries:
        raise ModelError(f"model folder {path!r} is empty; {_REFETCH}")
    for name in sorted(entries):
        if name.endswith(".safetensors"):
            problem = safetensors_problem(os.path.join(path, name))
            if problem is not None:
                raise ModelError(f"model weights {os.path.join(path, name)} are damaged ({problem}); {_REFETCH}")


def _from_pretrained(auto_class, path: str, **kwargs):
    """``auto_class.from_pretrained`` with user-facing errors for paths that do not resolve."""
    path = os.path.expanduser(str(path))
    looks_local = path.startswith((".", "/", "~")) or os.path.isabs(path)
    if looks_local and not os.path.isdir(path):
        raise _missing_model(path, FileNotFoundError(path))
    if os.path.isdir(path):
        check_model_folder(path)
    try:
        return auto_class.from_pretrained(path, **kwargs)
    except OSError as err:  # transformers raises OSError for unknown ids and offline misses
        raise _missing_model(path, err) from err


def load_config(path: str, *, trust_remote_code: bool = False, override_config: dict | None = None):
    """The model config with ``override_config`` entries applied (unknown keys are an error)."""
    from transformers import AutoConfig

    config = _from_pretrained(AutoConfig, path, trust_remote_code=trust_remote_code)
    for key, value in (override_config or {}).items():
        if not hasattr(config, key):
            raise ConfigError(f"override_config key {key!r} is not a field of {type(config).__name__}; "
                              f"check the spelling against the model's config.json")
        setattr(config, key, value)
    return config


def load_causal_lm(
    path: str,
    *,
    dtype: str | torch.dtype = "float32",
    attn_implementation: str | None = None,
    gradient_checkpointing: bool = False,
    trust_remote_code: bool = False,
    override_config: dict | None = None,
):
    """An ``AutoModelForCausalLM`` in ``dtype``, optionally with gradient checkpointing."""
    from transformers import AutoModelForCausalLM

    config = load_config(path, trust_remote_code=trust_remote_code, override_config=override_config)
    model = _from_pretrained(
        AutoModelForCausalLM, path, config=config, dtype=resolve_dtype(dtype),
        attn_implementation=attn_implementation, trust_remote_code=trust_remote_code,
    )
    if gradient_checkpointing:
        enable_gradient_checkpointing(model)
    return model


def import_external_lib(module: str | None) -> None:
    """Import the module a config names in ``external_lib`` (it registers custom architectures)."""
    if module:
        importlib.import_module(module)


def enable_gradient_checkpointing(model) -> None:
    """Recompute activations in backward; non-reentrant so frozen inputs still get gradients."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False  # a KV cache is useless (and wasted memory) in training


def load_tokenizer(path: str, *, trust_remote_code: bool = False, padding_side: str = "left",
                   chat_template: str | None = None):
    """The model's tokenizer; a missing pad token falls back to EOS (as verl does); ``chat_template``
    (a Jinja string) replaces the tokenizer's own."""
    from transformers import AutoTokenizer

    tokenizer = _from_pretrained(AutoTokenizer, path, trust_remote_code=trust_remote_code)
    if chat_template:
        tokenizer.chat_template = chat_template
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = padding_side
    return tokenizer

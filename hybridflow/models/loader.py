"""Load HF causal LMs and tokenizers by local path or hub id (``actor_rollout_ref.model.path``).

One set of path rules for every model role: a local folder is used as is; anything
else is treated as a hub id, and a failure to resolve it becomes a ``ModelError`` that
names the path and the two ways to get a model without a hub.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import struct

import torch

from hybridflow.errors import ConfigError, ModelError
from hybridflow.models.config_checks import check_model_shapes

logger = logging.getLogger(__name__)

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


def _declared_model_type(path: str) -> str | None:
    """``model_type`` as written in ``path``'s config.json (None when unreadable), for messages."""
    try:
        with open(os.path.join(os.path.expanduser(str(path)), "config.json")) as handle:
            return json.load(handle).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def _unreadable_config(path: str, cause: Exception) -> ModelError:
    """An unknown ``model_type`` (the usual case) or a config transformers rejects for another reason."""
    import transformers
    from transformers import CONFIG_MAPPING

    model_type = _declared_model_type(path)
    if model_type in CONFIG_MAPPING:
        reason = cause.__cause__ or cause  # a validator's own ValueError says which field
        first_line = (str(reason).strip().splitlines() or [type(reason).__name__])[0].rstrip(".")
        return ModelError(f"transformers cannot read {path}/config.json (model_type {model_type!r}): {first_line}; "
                          f"fix that field of config.json, or copy the model folder again")
    return ModelError(
        f"{path}/config.json has model_type {_declared_model_type(path)!r}, which transformers "
        f"{transformers.__version__} does not know ({type(cause).__name__}); fix config.json's model_type and "
        f"architectures, set model.trust_remote_code=True for a model that ships its own code, "
        f"or name the module that registers it in model.external_lib"
    )


def check_causal_lm_config(config, path: str) -> None:
    """A config transformers knows, but not as a causal LM (say T5 or CLIP), is refused before loading."""
    from transformers import AutoModelForCausalLM

    has_remote_class = "AutoModelForCausalLM" in (getattr(config, "auto_map", None) or {})
    if type(config) in AutoModelForCausalLM._model_mapping or has_remote_class or _is_image_text_to_text(config):
        return
    raise ModelError(
        f"{path} holds a {config.model_type!r} model ({', '.join(config.architectures or ['no architectures'])}), "
        f"which transformers cannot load as a causal LM; point model.path at a causal LM "
        f"(llama, qwen2, qwen3, mistral, gemma2, ...)"
    )


def _is_image_text_to_text(config) -> bool:
    """A vision-language model transformers generates text with (Qwen2-VL, Qwen2.5-VL, ...)."""
    from transformers import AutoModelForImageTextToText

    from hybridflow.models.vision import is_vision_language

    return is_vision_language(config) and type(config) in AutoModelForImageTextToText._model_mapping


def auto_model_class(config):
    """``AutoModelForImageTextToText`` for a vision-language config, else ``AutoModelForCausalLM``."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if _is_image_text_to_text(config) else AutoModelForCausalLM


def _mismatched_shapes(path: str, config, mismatched: list) -> ModelError:
    key, saved, expected = sorted(mismatched, key=str)[0]
    return ModelError(
        f"the weights in {path} do not fit its config.json: {key} is {list(saved)} in the weights but "
        f"{list(expected)} by config.json ({len(mismatched)} tensors differ); set config.json's sizes "
        f"(hidden_size={getattr(config, 'hidden_size', '?')}, intermediate_size, num_attention_heads, ...) "
        f"to those the weights were saved with, or copy the model folder again"
    )


def _weights_not_loaded(path: str, config, *, missing: list, unexpected: list, total: int) -> ModelError:
    return ModelError(
        f"{len(missing)} of {total} weights of the {config.model_type!r} model in {path} are not in its weights "
        f"files ({len(unexpected)} weights there are unexpected), and would train from random values: config.json "
        f"({', '.join(config.architectures or ['no architectures'])}) and the weights files describe different "
        f"models, or the files are incomplete; restore the original config.json, or copy the model folder again"
    )


def check_loading_info(model, info: dict, path: str, *, new_heads: tuple[str, ...] = ()) -> None:
    """Refuse a model whose weights did not all load (they would be random, and train in silence).

    ``new_heads``: key prefixes a loader initialises on purpose (a reward model's ``score`` head
    on top of a causal LM checkpoint). Unexpected keys alone are fine (an LM head under a backbone).
    """
    if info["mismatched_keys"]:
        raise _mismatched_shapes(path, model.config, list(info["mismatched_keys"]))
    missing = [key for key in info["missing_keys"] if not key.startswith(new_heads)]
    if missing:
        raise _weights_not_loaded(path, model.config, missing=missing, unexpected=list(info["unexpected_keys"]),
                                  total=len(model.state_dict()))


def load_checked_weights(auto_class, path: str, *, new_heads: tuple[str, ...] = (), **kwargs):
    """``auto_class.from_pretrained`` that refuses weights of another size or architecture (one line each).

    ``ignore_mismatched_sizes`` only lets transformers report shape mismatches instead of raising
    a RuntimeError; :func:`check_loading_info` then refuses them.
    """
    kwargs = {**dequantize_at_load(kwargs.get("config"), path), **kwargs}
    with _held_back_load_report() as report:
        model, info = _from_pretrained(auto_class, path, output_loading_info=True, ignore_mismatched_sizes=True,
                                       **kwargs)
    check_loading_info(model, info, path, new_heads=new_heads)
    report.release()
    return model


def dequantize_at_load(config, path: str) -> dict:
    """``from_pretrained`` arguments that load a checkpoint shipped quantized in the training dtype (issue 58).

    gpt-oss ships its experts in MXFP4 (``quantization_config.quant_method: mxfp4``; ``*_blocks`` / ``*_scales``
    tensors: 32-value blocks of fp4 e2m1 with one e8m0 scale): transformers' ``Mxfp4Config(dequantize=True)``
    expands them into ``gate_up_proj`` / ``down_proj`` of the requested dtype, as TRL does for training (the
    quantized experts have no gradient and the native engine reads plain weights). Without it transformers keeps
    them quantized wherever its MXFP4 kernels are installed (a GPU with ``kernels`` and Triton). Other methods load
    as transformers decides."""
    quantization = getattr(config, "quantization_config", None) if config is not None else None
    method = quantization.get("quant_method") if isinstance(quantization, dict) else getattr(quantization,
                                                                                             "quant_method", None)
    if str(method).lower() != "mxfp4":
        return {}
    from transformers import Mxfp4Config

    logger.info("%s: MXFP4 experts dequantized at load (Mxfp4Config(dequantize=True)), trained and sampled in "
                "the model dtype", path)
    return {"quantization_config": Mxfp4Config(dequantize=True)}


class _HeldBackRecords(logging.Filter):
    """Keeps a logger's records back; ``release`` logs them after all."""

    def __init__(self, logger: logging.Logger):
        super().__init__()
        self.logger, self.records = logger, []

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(record)
        return False

    def release(self) -> None:
        for record in self.records:
            self.logger.handle(record)


@contextlib.contextmanager
def _held_back_load_report():
    """transformers' LOAD REPORT table (one row per missing weight) is shown only for a model that passes
    :func:`check_loading_info`; a refused one gets its one line alone."""
    logger = logging.getLogger("transformers.modeling_utils")
    held = _HeldBackRecords(logger)
    logger.addFilter(held)
    try:
        yield held
    finally:
        logger.removeFilter(held)


def load_config(path: str, *, trust_remote_code: bool = False, override_config: dict | None = None):
    """The model config with ``override_config`` entries applied (unknown keys are an error)."""
    from transformers import AutoConfig

    import huggingface_hub.errors

    # transformers 5 validates config fields through huggingface_hub's strict dataclasses
    strict_dataclass_error = getattr(huggingface_hub.errors, "StrictDataclassError", ValueError)
    try:
        config = _from_pretrained(AutoConfig, path, trust_remote_code=trust_remote_code)
    except (ValueError, KeyError, strict_dataclass_error) as err:  # mostly a model_type transformers has no class for
        raise _unreadable_config(path, err) from err
    for key, value in (override_config or {}).items():
        if not hasattr(config, key):
            raise ConfigError(f"override_config key {key!r} is not a field of {type(config).__name__}; "
                              f"check the spelling against the model's config.json")
        setattr(config, key, value)
    check_routing(config, path)
    check_model_shapes(config, path)
    return config


EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
"""Where a mixture-of-experts config keeps its expert count (Qwen2/3-MoE, Mixtral, DeepSeek)."""


def check_routing(config, path: str) -> None:
    """A mixture-of-experts config whose routing cannot run (top-k outside 1..experts: torch.topk fails at the
    first forward; ``decoder_sparse_step=0``: a modulo by zero while the layers are built) is one ModelError line
    before any weight loads."""
    text = config.get_text_config()
    experts = next((getattr(text, key) for key in EXPERT_COUNT_KEYS if getattr(text, key, None)), None)
    top_k = getattr(text, "num_experts_per_tok", None)
    where = f"{path}/config.json (or model.override_config)"
    if experts and top_k is not None and not 1 <= top_k <= experts:
        raise ModelError(f"{where} routes each token to num_experts_per_tok={top_k} of its {experts} experts: set "
                         f"num_experts_per_tok between 1 and {experts}")
    step = getattr(text, "decoder_sparse_step", None)
    if experts and step is not None and step < 1:
        raise ModelError(f"{where} has decoder_sparse_step={step}: every how many layers a layer is a mixture of "
                         "experts must be >= 1 (1 = every layer)")


def check_vocab_covers_tokenizer(config, tokenizer, path: str, *, tokenizer_key: str) -> None:
    """A model whose embedding has fewer rows (``vocab_size``) than the tokenizer has tokens would index past it
    on the first prompt that holds one of the extra tokens: one ModelError line before any weight loads."""
    rows, tokens = getattr(config.get_text_config(), "vocab_size", None), len(tokenizer)
    if rows is not None and rows < tokens:
        raise ModelError(f"the model in {path} has vocab_size={rows} embedding rows but the tokenizer "
                         f"({tokenizer_key}) has {tokens} tokens: ids {rows}..{tokens - 1} would index past the "
                         "embedding; use the model's own tokenizer, or resize the model's embeddings "
                         "(model.resize_token_embeddings(len(tokenizer)) and save it)")


def load_causal_lm(
    path: str,
    *,
    dtype: str | torch.dtype = "float32",
    attn_implementation: str | None = None,
    gradient_checkpointing: bool = False,
    trust_remote_code: bool = False,
    override_config: dict | None = None,
    config_path: str | None = None,
):
    """An ``AutoModelForCausalLM`` (a vision-language model: ``AutoModelForImageTextToText``) in ``dtype``,
    optionally with gradient checkpointing; ``config_path``: the HF config's folder when not ``path``'s
    (verl's ``model.hf_config_path``)."""
    config = load_config(config_path or path, trust_remote_code=trust_remote_code, override_config=override_config)
    check_causal_lm_config(config, path)
    model = load_checked_weights(
        auto_model_class(config), path, config=config, dtype=resolve_dtype(dtype),
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

    _require_tokenizer_files(path)
    tokenizer = _from_pretrained(AutoTokenizer, path, trust_remote_code=trust_remote_code)
    if chat_template:
        tokenizer.chat_template = chat_template
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = padding_side
    return tokenizer


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model",
                   "vocab.txt", "tokenizer.tiktoken")


def _require_tokenizer_files(path: str) -> None:
    """A local model folder without any tokenizer file: one line (transformers would raise a traceback)."""
    folder = os.path.expanduser(str(path))
    # an empty folder is left to check_model_folder (in _from_pretrained), which says so
    if os.path.isdir(folder) and os.listdir(folder) and not any(os.path.isfile(os.path.join(folder, name)) for name in TOKENIZER_FILES):
        raise ModelError(
            f"{folder} has no tokenizer files (none of {', '.join(TOKENIZER_FILES[:3])}, ...); copy the tokenizer "
            "of the model it was trained from into it (tokenizer.save_pretrained(folder)), or point "
            "data.tokenizer at a folder that has one"
        )

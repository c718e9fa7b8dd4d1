"""Models: HF causal LMs, value and reward models, tiny test models, the offline default."""

from hybridflow.models.default_model import fetch_default_model
from hybridflow.models.loader import load_causal_lm, load_config, load_tokenizer, resolve_dtype
from hybridflow.models.logprob import compute_log_probs, packed_log_probs
from hybridflow.models.reward_model import load_reward_model
from hybridflow.models.value_model import ValueModel, load_value_model

__all__ = [
    "ValueModel",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "compute_log_probs",
    "packed_log_probs",
    "fetch_default_model",
    "load_causal_lm",
    "load_config",
    "load_reward_model",
    "load_tokenizer",
    "load_value_model",
    "resolve_dtype",
    "save_tiny_model",
]

_TINY = ("build_tiny_model", "build_tiny_tokenizer", "save_tiny_model")


def __getattr__(name: str):
    # tiny is imported on first use, so `python -m hybridflow.models.tiny` runs without runpy's double-import warning
    if name in _TINY:
        from hybridflow.models import tiny

        return getattr(tiny, name)
    raise AttributeError(f"module 'hybridflow.models' has no attribute '{name}'")

"""Generation engines behind one interface: ``generate(prompt_token_ids, SamplingParams)``.

Backends: ``native`` (default; paged KV cache, continuous batching), ``hf`` (HF
``generate``, the reference) and ``vllm`` (when installed).
"""

from hybridflow.rollout.config import sampling_params_from_rollout_config
from hybridflow.rollout.engine import ENGINES, Engine, build_engine, list_engines, register_engine
from hybridflow.rollout.types import Completion, SamplingParams

__all__ = [
    "ENGINES",
    "Completion",
    "Engine",
    "SamplingParams",
    "build_engine",
    "list_engines",
    "register_engine",
    "sampling_params_from_rollout_config",
]

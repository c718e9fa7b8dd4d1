"""The dtype a CPU rollout engine (native, HF) holds its weights and KV cache in: ``rollout.dtype`` .

verl's ``rollout.dtype`` (default ``bfloat16``) is the engine's dtype. On a CPU bf16 is fast only with bf16 units
(AVX-512-BF16 / AMX: a bf16 matmul 2-5x fp32's); without them it is 27-161x slower, so there a bf16 choice runs in
fp32, said once. ``float32`` is fp32 everywhere. The sampler always runs in fp32 (the logits are cast first).
"""

from __future__ import annotations

import functools
import logging

import torch

from hybridflow.cpu import cpu_has_bf16, cpu_precision_reason
from hybridflow.errors import ConfigError

logger = logging.getLogger(__name__)

_BF16_NAMES = ("bfloat16", "bf16", "auto")
_FP32_NAMES = ("float32", "fp32", "float")
_FP16_NAMES = ("float16", "fp16", "half")


def cpu_engine_dtype(rollout_dtype: str) -> torch.dtype:
    """``rollout.dtype`` on a CPU: bf16 where the CPU has bf16 units (``hybridflow.cpu.cpu_has_bf16``), else fp32;
    ``float32`` always fp32; ``float16`` fp32 (CPUs have no fast fp16 matmul), said once."""
    name = str(rollout_dtype).lower()
    if name in _FP32_NAMES:
        return torch.float32
    if name in _FP16_NAMES:
        _say_once(f"rollout.dtype={rollout_dtype}: the CPU engine runs in fp32 (no fast fp16 matmuls on CPUs)")
        return torch.float32
    if name not in _BF16_NAMES:
        raise ConfigError(f"actor_rollout_ref.rollout.dtype={rollout_dtype!r} is not a dtype: use bfloat16 (bf16 where "
                          "the CPU has bf16 units, fp32 elsewhere) or float32")
    bf16 = cpu_has_bf16()
    _say_once(f"rollout.dtype={rollout_dtype}: the CPU engine runs in {'bf16' if bf16 else 'fp32'} "
              f"({cpu_precision_reason()}); rollout.dtype=float32 runs it in fp32")
    return torch.bfloat16 if bf16 else torch.float32


@functools.cache
def _say_once(line: str) -> None:
    logger.warning("hybridflow: %s", line)

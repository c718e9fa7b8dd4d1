"""Capture and restore every random-number generator a worker process uses.

A resumed run must draw the same random numbers it would have drawn without the crash
(dropout masks, sampling noise, shuffles), so each worker saves the state of Python's
``random``, numpy's global generator, torch's CPU generator and every CUDA device's
generator into ``rng_state_rank{r}.pt``. The state is made of tensors, ints and tuples
only, so it loads with ``torch.load(weights_only=True)``.

Lives in ``models/`` (beside the sharded checkpoint component that saves it) so that both
checkpoint components, the single-process one in ``trainer/`` and the FSDP2 one here, use
this one implementation.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def rng_file(rank: int) -> str:
    """File name of rank ``rank``'s RNG state inside a component directory."""
    return f"rng_state_rank{rank}.pt"


def capture_rng_state() -> dict[str, Any]:
    """The current state of all generators; capturing does not advance any of them."""
    numpy_state = np.random.get_state(legacy=False)
    return {
        "python": random.getstate(),
        "numpy": {
            "bit_generator": numpy_state["bit_generator"],
            "key": torch.from_numpy(numpy_state["state"]["key"].astype(np.int64)),
            "pos": int(numpy_state["state"]["pos"]),
            "has_gauss": int(numpy_state["has_gauss"]),
            "gauss": float(numpy_state["gauss"]),
        },
        "torch_cpu": torch.get_rng_state(),
        "torch_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    """Set every generator to ``state`` (from :func:`capture_rng_state`); CUDA only if saved and present."""
    random.setstate(state["python"])
    numpy_state = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": numpy_state["bit_generator"],
            "state": {"key": numpy_state["key"].numpy().astype(np.uint32), "pos": numpy_state["pos"]},
            "has_gauss": numpy_state["has_gauss"],
            "gauss": numpy_state["gauss"],
        }
    )
    torch.set_rng_state(state["torch_cpu"])
    if state["torch_cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["torch_cuda"])

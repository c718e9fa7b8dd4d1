"""Copy trainer weights into a model in place (no reload from disk)."""

from __future__ import annotations

import torch

from hybridflow.errors import RolloutError


@torch.no_grad()
def copy_named_tensors(model: torch.nn.Module, named_tensors) -> int:
    """Copy each ``(name, tensor)`` into the model tensor of the same HF name; return the count.

    Tied weights (``lm_head.weight`` sharing the embedding) are found under either name.
    Tensors may come in another dtype or device; they are cast on copy.
    """
    targets = model.state_dict(keep_vars=True)
    copied = 0
    for name, tensor in named_tensors:
        if name not in targets:
            raise RolloutError(f"load_weights got unknown tensor {name!r}; send the HF model's state_dict names")
        target = targets[name]
        if tuple(target.shape) != tuple(tensor.shape):
            raise RolloutError(f"load_weights: {name} has shape {tuple(tensor.shape)}, the engine expects "
                               f"{tuple(target.shape)}; gather full (unsharded) tensors before syncing")
        target.data.copy_(tensor)
        copied += 1
    return copied

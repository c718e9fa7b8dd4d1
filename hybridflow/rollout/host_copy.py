"""Host values onto the device without waiting for the device's queued work.

A plain host-to-device copy in PyTorch (``torch.tensor(values, device="cuda")``, ``tensor.to("cuda")``) comes from
pageable memory and synchronises the stream after it: the host waits for every kernel queued before the copy. The
engine's ``overlap_steps`` queues the next decode step while one is still running, so the inputs of that step go
through pinned memory with a non-blocking copy instead (PyTorch's pinned allocator keeps the buffer until the copy
has run). On CPU the tensor is returned as it is.
"""

from __future__ import annotations

import torch


def to_device(tensor: torch.Tensor, device) -> torch.Tensor:
    """``tensor`` (on the host) on ``device``; on CUDA without synchronising the stream."""
    device = torch.device(device)
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def device_tensor(values, *, dtype: torch.dtype | None = None, device) -> torch.Tensor:
    """``torch.tensor(values, dtype=dtype)`` on ``device`` (:func:`to_device`)."""
    return to_device(torch.tensor(values, dtype=dtype), device)

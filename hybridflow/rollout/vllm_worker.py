"""The vLLM worker extension that syncs the trainer's weights into vLLM's model in place.

vLLM imports it by name inside each of its worker processes (``LLM(worker_extension_cls=WORKER_EXTENSION)``; a
function sent through ``collective_rpc`` is refused by vLLM's serializer), as verl 0.9's and TRL's colocated
modes do. The trainer writes the weights into one shared-memory file (:func:`write_shared_weights`);
the worker maps it and hands the tensors to the model runner's ``reload_weights``: the model's own
``load_weights`` (vLLM's fused qkv / gate-up layouts) inside vLLM's layerwise reload, which undoes and redoes the
repacking done after the first load (the CPU backend repacks linears, whose params then lack ``weight_loader``:
``load_weights`` alone fails there). Imports only torch:
it runs in vLLM's environment.
"""

from __future__ import annotations

import torch

WORKER_EXTENSION = "hybridflow.rollout.vllm_worker.WeightSyncExtension"


def write_shared_weights(named_tensors, directory: str) -> tuple[str, list]:
    """Write ``named_tensors`` back to back into one file under ``directory`` (``/dev/shm`` where it exists: memory,
    not disk); returns its path and the layout :func:`read_shared_weights` takes."""
    import os
    import tempfile

    layout, chunks, offset = [], [], 0
    for name, tensor in named_tensors:
        data = tensor.detach().to("cpu").contiguous()
        raw = data.view(-1).view(torch.uint8) if data.numel() else torch.empty(0, dtype=torch.uint8)
        layout.append((name, str(data.dtype).replace("torch.", ""), list(data.shape), offset))
        chunks.append(raw)
        offset += raw.numel()
    handle, path = tempfile.mkstemp(prefix="hybridflow-weights-", dir=directory)
    with os.fdopen(handle, "wb") as f:
        for raw in chunks:
            f.write(memoryview(raw.numpy()))
    return path, layout


def read_shared_weights(path: str, layout: list[tuple[str, str, list[int], int]]):
    """``(name, tensor)`` views of the file at ``path``; ``layout`` rows are (name, dtype, shape, byte offset)."""
    import os

    flat = torch.from_file(path, shared=False, size=os.path.getsize(path), dtype=torch.uint8)
    for name, dtype, shape, offset in layout:
        dt = getattr(torch, dtype)
        count = 1
        for dim in shape:
            count *= dim
        nbytes = count * torch.empty((), dtype=dt).element_size()
        yield name, flat[offset:offset + nbytes].view(dt).view(shape)


class WeightSyncExtension:
    """Mixed into vLLM's worker class: ``self.model_runner`` is the worker's."""

    def hybridflow_load_weights(self, path: str, layout: list) -> int:
        """Load the weights in ``path`` (see :func:`read_shared_weights`) through the model's ``load_weights``;
        returns how many tensors were handed over."""
        weights = list(read_shared_weights(path, [tuple(row) for row in layout]))
        # vLLM's in-place reload restores the checkpoint layout of layers whose weights were repacked after
        # loading (the CPU backend repacks linears: their params lose ``weight_loader``), loads, repacks again
        self.model_runner.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
        return len(weights)

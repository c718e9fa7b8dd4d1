"""SFT checkpoints: one ``model`` component written by every rank, plus the HF export.

Layout (``trainer.default_local_dir``, verl's names)::

    global_step_{N}/
        model/
            dcp/                  sharded model + optimizer (DCP; reloads at any world size)
            lr_scheduler.pt       schedule position
            rng_state_rank{r}.pt  RNG of every rank
            huggingface/          config + tokenizer; with weights (merged, for LoRA) when exported
            lora_adapter/         LoRA runs: the adapter alone, in peft's format
        data.pt                   dataloader position (exact resume)
    latest_checkpointed_iteration.txt

The checkpoint manager (``checkpoints/manager.py``) runs on rank 0 only: it picks the temporary
step directory, publishes it atomically and writes the tracker. The other ranks must
write their shards into that same directory, so :class:`SharedDirComponent` broadcasts
it from rank 0 and every rank writes; a barrier keeps rank 0 from publishing before the
last shard is on disk.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist

from hybridflow.models.fsdp import full_state_dict
from hybridflow.models.hf_folder import HF_FOLDER, LORA_FOLDER, plain_hf_model, save_hf_folder
from hybridflow.models.lora import is_lora_model, save_adapter
from hybridflow.models.sharded_checkpoint import FSDPModelComponent
from hybridflow.data.parallel import DataParallel
from hybridflow.trainer.checkpoints.ownership import claim_run_folder


def _broadcast_from_rank0(value, dp: DataParallel):
    if dp.world_size == 1:
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=0, group=dp.group)
    return holder[0]


def _barrier(dp: DataParallel) -> None:
    if dp.world_size > 1:
        dist.barrier(group=dp.group)


def export_hf(model: torch.nn.Module, tokenizer, out_dir: str, *, dp: DataParallel) -> str | None:
    """Write a loadable HF folder (weights, config, tokenizer) to ``out_dir`` on rank 0; a collective."""
    state = full_state_dict(model)
    if dp.rank == 0:
        save_hf_folder(plain_hf_model(model, state), tokenizer, out_dir)
    _barrier(dp)
    return out_dir if dp.rank == 0 else None


class SharedDirComponent:
    """The SFT model component: sharded state from every rank, adapter and HF export from rank 0.

    ``export_weights()`` says whether this save writes full weights into ``huggingface/``.
    """

    def __init__(self, inner: FSDPModelComponent, *, dp: DataParallel, export_weights: Callable[[], bool]):
        self.inner, self.dp, self.export_weights = inner, dp, export_weights

    def save_to(self, directory: str | None) -> None:
        """Rank 0 passes the directory its checkpoint manager created; the other ranks pass None."""
        directory = _broadcast_from_rank0(directory, self.dp)
        self.inner.save_to(directory)
        model, tokenizer = self.inner.model, self.inner.tokenizer
        if is_lora_model(model):
            state = full_state_dict(model)
            if self.dp.rank == 0:
                save_adapter(model, os.path.join(directory, LORA_FOLDER), state_dict=state)
        if self.export_weights():
            export_hf(model, tokenizer, os.path.join(directory, HF_FOLDER), dp=self.dp)
        _barrier(self.dp)

    def load_from(self, directory: str) -> None:
        self.inner.load_from(directory)


def claim_folder(trainer, component: str, signature: Mapping[str, object], *, dp: DataParallel) -> None:
    """Refuse (one line, nothing touched) a ``trainer.default_local_dir`` whose checkpoints another
    configuration made, on every rank alike; ``trainer.start_over``: rank 0 deletes them (ownership.py)."""
    if not trainer.start_over:
        claim_run_folder(trainer.default_local_dir, trainer.resume_mode, (component,), signature)
        return
    if dp.rank == 0:
        claim_run_folder(trainer.default_local_dir, trainer.resume_mode, (component,), signature, start_over=True)
    _barrier(dp)

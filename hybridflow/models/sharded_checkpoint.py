"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP), and their merge into one HF folder.

Every rank writes only its own shards (in parallel, so save time and per-rank memory do
not grow with the model once the cluster grows with it), plus a metadata file that
records each tensor's global shape and which slices each file holds. Loading reads
whatever slices the *loading* ranks need, so a checkpoint written at world size N loads
at any world size M (DCP resharding), including M = 1 without a process group.

Layout of one component directory (``global_step_N/actor``)::

    dcp/                     DCP shards + .metadata: {"model": ..., "optim": ...}
    lr_scheduler.pt          scheduler state (identical on every rank; rank 0 writes it)
    rng_state_rank{r}.pt     each rank's RNG states
    huggingface/             config, generation config, tokenizer (+ weights with ``hf_model``; hf_folder.py)
    contents.json            which of model / optimizer / extra / hf_model were saved
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from hybridflow.errors import CheckpointError, ModelError
from hybridflow.models.fsdp import full_state_dict
from hybridflow.models.hf_folder import HF_FOLDER, has_hf_config, merge_into_hf_folder, plain_hf_model, save_hf_folder
from hybridflow.models.rng_state import capture_rng_state, restore_rng_state, rng_file
from hybridflow.models.value_model import export_value_model

DCP_FOLDER = "dcp"
SCHEDULER_FILE = "lr_scheduler.pt"
CONTENTS_FILE = "contents.json"
ALL_CONTENTS = ("model", "optimizer", "extra")


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _states(model: torch.nn.Module, optimizer) -> dict:
    optimizers = [optimizer] if optimizer is not None else []
    model_state, optim_state = get_state_dict(model, optimizers, options=StateDictOptions(strict=True))
    return {"model": model_state, "optim": optim_state} if optimizer is not None else {"model": model_state}


@contextlib.contextmanager
def _single_process_ok():
    """DCP warns when no process group exists; one process writing/reading everything is intended here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def save_sharded(directory: str, *, model: torch.nn.Module, optimizer=None) -> None:
    """Write model (and optimizer) shards of this rank into ``directory`` (a collective)."""
    with _single_process_ok():
        dcp.save(_states(model, optimizer), checkpoint_id=directory)


def load_sharded(directory: str, *, model: torch.nn.Module, optimizer=None) -> None:
    """Load ``directory`` into ``model`` (and ``optimizer``) in place, resharding to this world size."""
    if not os.path.isfile(os.path.join(directory, ".metadata")):
        raise ModelError(f"{directory} is not a DCP checkpoint (no .metadata); "
                         "point at global_step_N/actor/dcp written by a sharded run")
    states = _states(model, optimizer)
    check_same_model(directory, states["model"])
    with _single_process_ok():
        dcp.load(states, checkpoint_id=directory)
    optimizers = [optimizer] if optimizer is not None else []
    set_state_dict(model, optimizers, model_state_dict=states["model"],
                   optim_state_dict=states.get("optim", {}))


def _saved_shapes(directory: str) -> dict[str, tuple[int, ...]]:
    """Global shape of every tensor a DCP checkpoint holds, keyed as DCP flattens them (``model.<fqn>``)."""
    metadata = FileSystemReader(directory).read_metadata().state_dict_metadata
    return {key: tuple(meta.size) for key, meta in metadata.items() if isinstance(meta, TensorStorageMetadata)}


_START_FRESH = ("resume with the model the checkpoint was trained from (its config.json is in the step's "
                "huggingface/ folder), or start fresh in another trainer.default_local_dir, or with trainer.start_over=true "
                "to delete these checkpoints and start over there")


def check_same_model(directory: str, model_state: dict) -> None:
    """A checkpoint of another model size or architecture is one CheckpointError line, not DCP's traceback.

    ``model_state``: this rank's model state dict (DTensor shapes are global, as in the metadata).
    """
    saved = _saved_shapes(directory)
    current = {f"model.{name}": tuple(tensor.shape) for name, tensor in model_state.items()}
    differ = [(key, saved[key], shape) for key, shape in current.items() if key in saved and saved[key] != shape]
    if differ:
        key, there, here = differ[0]
        raise CheckpointError(f"checkpoint {directory} holds a model of another size: {key.removeprefix('model.')} is "
                              f"{list(there)} there but {list(here)} in the model loaded now ({len(differ)} tensors "
                              f"differ); {_START_FRESH}")
    absent = [key for key in current if key not in saved]
    if absent:
        raise CheckpointError(f"checkpoint {directory} holds another model: {len(absent)} of {len(current)} weights of "
                              f"the model loaded now are not in it (first: {absent[0].removeprefix('model.')}); "
                              f"{_START_FRESH}")


class FSDPModelComponent:
    """A (possibly FSDP2-sharded) model + optimizer + scheduler as a checkpoint component.

    Implements the trainer's ``save_to(dir)`` / ``load_from(dir)`` protocol; call both on
    every rank of the group with the same ``directory`` (a shared file system on multi-node).

    Contents (verl's ``checkpoint.save_contents`` / ``load_contents``): ``model`` (always: a
    checkpoint without weights cannot be resumed), ``optimizer``, ``extra`` (LR schedule and RNG
    state), ``hf_model`` (a loadable HF folder with full weights in ``huggingface/``; without it
    that folder holds config and tokenizer only). Loading restores what is both asked for and saved.
    """

    def __init__(self, model: torch.nn.Module, optimizer=None, lr_scheduler=None, tokenizer=None, *,
                 save_contents=ALL_CONTENTS, load_contents=None):
        self.model, self.optimizer, self.lr_scheduler, self.tokenizer = model, optimizer, lr_scheduler, tokenizer
        self.save_contents = set(save_contents) | {"model"}
        self.load_contents = set(save_contents if load_contents is None else load_contents) | {"model"}

    def save_to(self, directory: str) -> None:
        rank = _rank()
        optimizer = self.optimizer if "optimizer" in self.save_contents else None
        save_sharded(os.path.join(directory, DCP_FOLDER), model=self.model, optimizer=optimizer)
        if "extra" in self.save_contents:
            torch.save(capture_rng_state(), os.path.join(directory, rng_file(rank)))
        hf_state = full_state_dict(self.model) if "hf_model" in self.save_contents else None  # a collective
        if rank != 0:
            return
        with open(os.path.join(directory, CONTENTS_FILE), "w") as fh:
            json.dump(sorted(self.save_contents), fh)
        if self.lr_scheduler is not None and "extra" in self.save_contents:
            torch.save(self.lr_scheduler.state_dict(), os.path.join(directory, SCHEDULER_FILE))
        if has_hf_config(self.model):
            model = plain_hf_model(self.model, hf_state) if hf_state is not None else self.model
            save_hf_folder(model, self.tokenizer, os.path.join(directory, HF_FOLDER), include_weights=hf_state is not None)

    def load_from(self, directory: str) -> None:
        contents = self.load_contents & saved_contents(directory)
        optimizer = self.optimizer if "optimizer" in contents else None
        load_sharded(os.path.join(directory, DCP_FOLDER), model=self.model, optimizer=optimizer)
        if "extra" not in contents:
            return
        if self.lr_scheduler is not None:
            self.lr_scheduler.load_state_dict(torch.load(os.path.join(directory, SCHEDULER_FILE), weights_only=True))
        rng_path = os.path.join(directory, rng_file(_rank()))
        if os.path.isfile(rng_path):  # absent when resuming on more ranks than were saved
            restore_rng_state(torch.load(rng_path, weights_only=True))


def holds_value_model(dcp_dir: str) -> bool:
    """Whether a DCP checkpoint holds a critic (a ``ValueModel``: backbone + ``value_head``)."""
    if not os.path.isfile(os.path.join(dcp_dir, ".metadata")):
        return False
    return any(key.startswith("model.value_head.") for key in FileSystemReader(dcp_dir).read_metadata().state_dict_metadata)


def stored_weight_dtype(dcp_dir: str) -> torch.dtype:
    """The dtype of the first floating model tensor in a DCP checkpoint (a merged model keeps it: a bf16-trained
    model merges to bf16, not to an fp32 folder twice its size)."""
    for key, meta in FileSystemReader(dcp_dir).read_metadata().state_dict_metadata.items():
        if key.startswith("model.") and isinstance(meta, TensorStorageMetadata) and meta.properties.dtype.is_floating_point:
            return meta.properties.dtype
    return torch.float32


def saved_contents(directory: str) -> set[str]:
    """What a component directory holds (checkpoints from before contents.json hold everything)."""
    path = os.path.join(directory, CONTENTS_FILE)
    if not os.path.isfile(path):
        return set(ALL_CONTENTS)
    with open(path) as fh:
        return set(json.load(fh))


def merge_sharded_checkpoint(local_dir: str, target_dir: str) -> str:
    """Turn ``{local_dir}/dcp`` + ``{local_dir}/huggingface`` into one HF folder (single process).

    An actor becomes a causal LM folder; a critic a value-model folder (the backbone plus
    ``value_head.safetensors``, what ``load_value_model`` and ``critic.model.path`` read)."""
    dcp_dir = os.path.join(local_dir, DCP_FOLDER)
    if not os.path.isfile(os.path.join(local_dir, HF_FOLDER, "config.json")) or not os.path.isdir(dcp_dir):
        raise ModelError(f"{local_dir} is not a checkpoint directory (needs {DCP_FOLDER}/ and {HF_FOLDER}/config.json); "
                         "pass --local_dir {default_local_dir}/global_step_N/actor")
    load_weights = lambda model: load_sharded(dcp_dir, model=model)  # noqa: E731
    if holds_value_model(dcp_dir):
        return export_value_model(os.path.join(local_dir, HF_FOLDER), target_dir, load_weights=load_weights)
    return merge_into_hf_folder(local_dir, target_dir, dtype=stored_weight_dtype(dcp_dir), load_weights=load_weights)

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
    huggingface/             config, generation config, tokenizer (no weights)
"""

from __future__ import annotations

import contextlib
import os
import random
import warnings

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from hybridflow.errors import ModelError

DCP_FOLDER = "dcp"
HF_FOLDER = "huggingface"
SCHEDULER_FILE = "lr_scheduler.pt"


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
    with _single_process_ok():
        dcp.load(states, checkpoint_id=directory)
    optimizers = [optimizer] if optimizer is not None else []
    set_state_dict(model, optimizers, model_state_dict=states["model"],
                   optim_state_dict=states.get("optim", {}))


def _rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def _restore_rng(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


class FSDPModelComponent:
    """A (possibly FSDP2-sharded) model + optimizer + scheduler as a checkpoint component.

    Implements the trainer's ``save_to(dir)`` / ``load_from(dir)`` protocol; call both on
    every rank of the group with the same ``directory`` (a shared file system on multi-node).
    """

    def __init__(self, model: torch.nn.Module, optimizer=None, lr_scheduler=None, tokenizer=None):
        self.model, self.optimizer, self.lr_scheduler, self.tokenizer = model, optimizer, lr_scheduler, tokenizer

    def save_to(self, directory: str) -> None:
        rank = _rank()
        save_sharded(os.path.join(directory, DCP_FOLDER), model=self.model, optimizer=self.optimizer)
        torch.save(_rng_state(), os.path.join(directory, f"rng_state_rank{rank}.pt"))
        if rank != 0:
            return
        if self.lr_scheduler is not None:
            torch.save(self.lr_scheduler.state_dict(), os.path.join(directory, SCHEDULER_FILE))
        save_hf_metadata(self.model, self.tokenizer, os.path.join(directory, HF_FOLDER))

    def load_from(self, directory: str) -> None:
        load_sharded(os.path.join(directory, DCP_FOLDER), model=self.model, optimizer=self.optimizer)
        if self.lr_scheduler is not None:
            self.lr_scheduler.load_state_dict(torch.load(os.path.join(directory, SCHEDULER_FILE), weights_only=True))
        rng_path = os.path.join(directory, f"rng_state_rank{_rank()}.pt")
        if os.path.isfile(rng_path):  # absent when resuming on more ranks than were saved
            _restore_rng(torch.load(rng_path, weights_only=False))


def save_hf_metadata(model: torch.nn.Module, tokenizer, out_dir: str) -> None:
    """Config, generation config and tokenizer files: everything of an HF folder but the weights."""
    os.makedirs(out_dir, exist_ok=True)
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "save_pretrained"):
        return
    config.save_pretrained(out_dir)
    from hybridflow.models.lora import is_lora_model

    if is_lora_model(model):  # adapter_config.json: the merger rebuilds the LoRA structure to load the shards
        model.peft_config["default"].save_pretrained(out_dir)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)


def merge_sharded_checkpoint(local_dir: str, target_dir: str) -> str:
    """Turn ``{local_dir}/dcp`` + ``{local_dir}/huggingface`` into one HF folder (single process)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    hf_dir = os.path.join(local_dir, HF_FOLDER)
    if not os.path.isfile(os.path.join(hf_dir, "config.json")):
        raise ModelError(f"{local_dir} has no {HF_FOLDER}/config.json; pass --local_dir global_step_N/actor")
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(hf_dir), dtype=torch.float32)
    lora = os.path.isfile(os.path.join(hf_dir, "adapter_config.json"))
    if lora:  # an RL/SFT run with LoRA: load the adapter too, then fold it into the weights
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig.from_pretrained(hf_dir))
    load_sharded(os.path.join(local_dir, DCP_FOLDER), model=model)
    if lora:
        from hybridflow.models.lora import merge_lora

        model = merge_lora(model)
    if os.path.isfile(os.path.join(hf_dir, "generation_config.json")):
        model.generation_config = GenerationConfig.from_pretrained(hf_dir)
    model.save_pretrained(target_dir)
    if os.path.isfile(os.path.join(hf_dir, "tokenizer_config.json")):
        AutoTokenizer.from_pretrained(hf_dir).save_pretrained(target_dir)
    return target_dir

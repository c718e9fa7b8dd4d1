"""What a checkpoint is made of: components that write themselves into a directory.

The checkpoint manager (``checkpoint.py``) owns the step directory and its atomic
publication; each component only writes its files into the directory it is given and
reads them back. That is the whole interface (:class:`Checkpointable`), so a sharded
FSDP2 component (every rank writing its DCP shard into the same directory) or a remote
worker-group proxy plugs in without the manager changing.

:class:`ModelComponent` is the single-process model + optimizer + LR scheduler case
(verl's actor/critic directory)::

    model.safetensors        weights (tied weights stored once)
    optim.pt                 optimizer.state_dict()
    lr_scheduler.pt          lr_scheduler.state_dict()
    rng_state_rank{r}.pt     RNG states of the process that owns rank r
    huggingface/             config, generation config, tokenizer (no weights)

:class:`StateDictComponent` wraps anything with ``state_dict()`` / ``load_state_dict()``.
"""

from __future__ import annotations

import os
from typing import Any, Protocol, runtime_checkable

import torch
from safetensors.torch import load_model, save_model

from hybridflow.errors import ModelError
from hybridflow.models.hf_folder import HF_FOLDER, has_hf_config, save_hf_folder
from hybridflow.models.rng_state import capture_rng_state, restore_rng_state, rng_file
from hybridflow.models.sharded_checkpoint import SCHEDULER_FILE
from hybridflow.trainer.hf_export import WEIGHTS_FILE

OPTIMIZER_FILE = "optim.pt"


@runtime_checkable
class Checkpointable(Protocol):
    def save_to(self, directory: str) -> None:
        """Write this component's files into ``directory`` (created, empty)."""

    def load_from(self, directory: str) -> None:
        """Restore this component from the files ``save_to`` wrote into ``directory``."""


@runtime_checkable
class HasStateDict(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> Any: ...


def _require_file(directory: str, name: str) -> str:
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
        raise ModelError(f"checkpoint directory {directory} has no {name}; it was not written by this component")
    return path


class ModelComponent:
    """A model with its optional optimizer, LR scheduler and tokenizer, owned by process ``rank``."""

    def __init__(self, model: torch.nn.Module, optimizer=None, lr_scheduler=None, tokenizer=None, rank: int = 0):
        self.model, self.optimizer, self.lr_scheduler = model, optimizer, lr_scheduler
        self.tokenizer, self.rank = tokenizer, rank

    def save_to(self, directory: str) -> None:
        save_model(self.model, os.path.join(directory, WEIGHTS_FILE))
        if self.optimizer is not None:
            torch.save(self.optimizer.state_dict(), os.path.join(directory, OPTIMIZER_FILE))
        if self.lr_scheduler is not None:
            torch.save(self.lr_scheduler.state_dict(), os.path.join(directory, SCHEDULER_FILE))
        torch.save(capture_rng_state(), os.path.join(directory, rng_file(self.rank)))
        if has_hf_config(self.model):
            save_hf_folder(self.model, self.tokenizer, os.path.join(directory, HF_FOLDER), include_weights=False)

    def load_from(self, directory: str) -> None:
        load_model(self.model, _require_file(directory, WEIGHTS_FILE), strict=True)
        if self.optimizer is not None:
            self.optimizer.load_state_dict(torch.load(_require_file(directory, OPTIMIZER_FILE), weights_only=True))
        if self.lr_scheduler is not None:
            self.lr_scheduler.load_state_dict(torch.load(_require_file(directory, SCHEDULER_FILE), weights_only=True))
        restore_rng_state(torch.load(_require_file(directory, rng_file(self.rank)), weights_only=True))


class StateDictComponent:
    """Any object with ``state_dict()`` / ``load_state_dict()``, pickled to ``{directory}/{filename}``.

    Loading unpickles arbitrary objects (``weights_only=False``): only load checkpoints you wrote.
    """

    def __init__(self, obj: HasStateDict, filename: str = "state.pt"):
        self.obj, self.filename = obj, filename

    def save_to(self, directory: str) -> None:
        torch.save(self.obj.state_dict(), os.path.join(directory, self.filename))

    def load_from(self, directory: str) -> None:
        self.obj.load_state_dict(torch.load(_require_file(directory, self.filename), weights_only=False))


def as_component(obj: Checkpointable | HasStateDict) -> Checkpointable:
    """Use ``obj`` as a component: itself if it has ``save_to``/``load_from``, else wrapped by its state dict."""
    if isinstance(obj, Checkpointable):
        return obj
    if isinstance(obj, HasStateDict):
        return StateDictComponent(obj)
    raise TypeError(
        f"{type(obj).__name__} is not checkpointable: give it save_to/load_from or state_dict/load_state_dict"
    )

"""What a checkpoint is made of: components that write themselves into a directory.

The checkpoint manager (``manager.py``) owns the step directory and its atomic
publication; each component only writes its files into the directory it is given and
reads them back. That is the whole interface (:class:`Checkpointable`), so a sharded
FSDP2 component (every rank writing its DCP shard into the same directory) or a remote
worker-group proxy plugs in without the manager changing.

:class:`hybridflow.models.sharded_checkpoint.FSDPModelComponent` is the model + optimizer + LR
scheduler component of every trainer, at any world size (one process included): verl's actor /
critic directory with the weights and optimizer state as a DCP checkpoint in ``dcp/``.
:class:`StateDictComponent` wraps anything with ``state_dict()`` / ``load_state_dict()``.
"""

from __future__ import annotations

import os
from typing import Any, Protocol, runtime_checkable

import torch

from hybridflow.errors import ModelError


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

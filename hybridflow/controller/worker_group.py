"""A worker group: N ranks of one role behind one object whose methods look like the worker's.

``group.compute_log_prob(batch, temperature=1.0)`` splits ``batch`` by data-parallel
rank, runs the method on every rank (in this process, or in Ray actors), and merges
the answers, as the method's dispatch declaration says (``controller/dispatch.py``).
The PPO loop calls a group exactly as it calls a plain worker.

Backends (the ``trainer.backend`` key) build the N ranks and run calls on them:

- ``local``: one in-process worker, world size 1, no copies, no serialisation;
- ``ray``:   one Ray actor per rank, each in one torch.distributed process group
  (``controller/ray_backend.py``).

Every backend builds its workers with the same *factory*: a picklable callable
``factory(dp: DataParallel) -> worker``, so a worker is built identically everywhere.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol

from hybridflow.controller.dispatch import COLLECTORS, SPLITTERS, Call, Mode, dispatch_table
from hybridflow.errors import ConfigError
from hybridflow.data.parallel import LOCAL


class Backend(Protocol):
    world_size: int

    def execute(self, method: str, calls: list[Call]) -> list[Any]:
        """Run ``method`` with ``calls[r]`` on rank r (fewer calls = the first ranks only)."""

    def execute_by_reference(self, method: str, calls: list[Call]) -> list[Any]:
        """``execute``, keeping rank 0's result where it was made: ``[a handle another group's call accepts]``."""

    def shutdown(self) -> None: ...


class LocalBackend:
    """World size 1, in this process: the laptop default and the reference for equivalence."""

    world_size = 1

    def __init__(self, factory: Callable, **_unused):
        self.worker = factory(LOCAL)

    def execute(self, method: str, calls: list[Call]) -> list[Any]:
        return [getattr(self.worker, method)(*args, **kwargs) for args, kwargs in calls]

    def execute_by_reference(self, method: str, calls: list[Call]) -> list[Any]:
        return self.execute(method, calls)[:1]  # in one process the value itself is the handle: no copy

    def shutdown(self) -> None:
        self.worker = None


def _ray_backend(factory: Callable, **kwargs) -> Backend:
    from hybridflow.controller.ray_backend import RayBackend  # Ray is imported only when asked for

    return RayBackend(factory, **kwargs)


BACKENDS: dict[str, Callable[..., Backend]] = {"local": LocalBackend, "ray": _ray_backend}


class WorkerGroup:
    """The ranks of one role; attribute access returns the dispatched methods of ``worker_cls``."""

    def __init__(self, *, worker_cls: type, backend: Backend, name: str = "worker", ranks_per_shard: int = 1):
        self.worker_cls = worker_cls
        self.backend = backend
        self.name = name
        self.methods = dispatch_table(worker_cls)
        # Sequence parallelism: consecutive groups of ranks_per_shard ranks take the same data shard
        # (workers/sequence_parallel.py); the local backend's one rank takes everything.
        self.ranks_per_shard = ranks_per_shard if backend.world_size > 1 else 1

    @property
    def world_size(self) -> int:
        return self.backend.world_size

    @property
    def data_parallel_size(self) -> int:
        """Data shards per call: the ranks over the sequence-parallel size (what batch balancing splits for)."""
        return self.world_size // self.ranks_per_shard

    def call(self, method: str, *args, **kwargs) -> Any:
        """Split the arguments, run on the ranks, collect: one call of the declared method."""
        spec = self.methods[method]
        if spec.mode is not Mode.DP_COMPUTE or self.ranks_per_shard == 1:
            calls = SPLITTERS[spec.mode](args, kwargs, self.world_size)
            return COLLECTORS[spec.collect](self.backend.execute(method, calls))
        repeat = self.ranks_per_shard  # every rank of a shard gets it; the first one answers for all
        shards = SPLITTERS[spec.mode](args, kwargs, self.world_size // repeat)
        results = self.backend.execute(method, [call for call in shards for _ in range(repeat)])
        return COLLECTORS[spec.collect](results[::repeat])

    def call_by_reference(self, method: str, *args, **kwargs) -> Any:
        """``call`` for a result that goes on to another group (a weight sync from the training ranks to the
        rollout ranks): on Ray, rank 0's answer stays in the object store and a reference comes back, which the
        other group's ranks read directly, so the driver never deserialises or re-sends the data; in one
        process, the value itself. Only for methods whose collector is ``first`` (rank 0 answers for all)."""
        spec = self.methods[method]
        if spec.collect != "first":
            raise ValueError(f"{self.name}.{method} is collected as {spec.collect!r}; call_by_reference keeps "
                             f"rank 0's result only, so it needs collect='first'")
        return self.backend.execute_by_reference(method, SPLITTERS[spec.mode](args, kwargs, self.world_size))[0]

    def __getattr__(self, method: str) -> Callable:
        methods = self.__dict__.get("methods", {})
        if method not in methods:
            raise AttributeError(f"{self.__dict__.get('name', 'worker')} group has no dispatched method "
                                 f"{method!r}; declared: {', '.join(sorted(methods))}")
        return functools.partial(self.call, method)

    def shutdown(self) -> None:
        self.backend.shutdown()


def build_worker_group(factory: Callable, *, worker_cls: type, backend: str = "local", name: str = "worker",
                       ranks_per_shard: int = 1, **backend_kwargs) -> WorkerGroup:
    """A group of ``worker_cls`` built by ``factory`` on the named backend (``local`` or ``ray``);
    ``ranks_per_shard`` consecutive ranks receive the same data shard (the sequence-parallel size)."""
    if backend not in BACKENDS:
        raise ConfigError(f"trainer.backend={backend!r}; choose from {', '.join(BACKENDS)}")
    return WorkerGroup(worker_cls=worker_cls, backend=BACKENDS[backend](factory, name=name, **backend_kwargs),
                       name=name, ranks_per_shard=ranks_per_shard)

"""The Ray backend: one Ray actor per rank, all ranks in one torch.distributed process group.

Start-up, for a group of N ranks on a reserved placement group (``resources.reserve``):

1. N actors are placed one per bundle (a colocated group takes ``share`` of each bundle);
2. rank 0 reports its node IP and a free port: MASTER_ADDR / MASTER_PORT for everyone;
3. every rank sets RANK / WORLD_SIZE / LOCAL_RANK and joins the process group (gloo on
   CPU, nccl on GPU), then builds its worker with the group's factory.

A call runs on all ranks at once. If a rank's process dies, or raises, the others are
usually blocked in a collective that will never complete, so the whole group is torn
down and the error names the group, the rank, its node and pid, and the method.
"""

from __future__ import annotations

import os
import socket
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
import torch

from hybridflow.controller.dispatch import Call
from hybridflow.controller.resources import ResourcePool, connect_ray, reserve
from hybridflow.errors import ConfigError, HybridflowError, WorkerDiedError
from hybridflow.data.parallel import DataParallel


class RankProcess:
    """The body of one rank's Ray actor: process-group membership, the worker, and calls on it."""

    def __init__(self, *, rank: int, world_size: int, threads: int):
        self.rank, self.world_size = rank, world_size
        torch.set_num_threads(max(1, threads))
        self.worker = None

    def location(self) -> tuple[str, int, str]:
        """(node IP, pid, Ray node id): several logical nodes of a local cluster share one IP."""
        return ray.util.get_node_ip_address(), os.getpid(), ray.get_runtime_context().get_node_id()

    def free_endpoint(self) -> tuple[str, int]:
        with socket.socket() as sock:
            sock.bind(("", 0))
            return ray.util.get_node_ip_address(), sock.getsockname()[1]

    def join(self, *, master_addr: str, master_port: int, dist_backend: str, local_rank: int) -> None:
        import torch.distributed as dist

        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), RANK=str(self.rank),
                          WORLD_SIZE=str(self.world_size), LOCAL_RANK=str(local_rank))
        dist.init_process_group(dist_backend, rank=self.rank, world_size=self.world_size)

    def build(self, factory: Callable) -> None:
        self.worker = factory(DataParallel(world_size=self.world_size, rank=self.rank, group=None))

    def call(self, method: str, args: tuple, kwargs: dict, *, reply: str = "value") -> Any:
        """Run ``method``; an argument that is a Ray object reference (another group's kept result) is read
        here, straight from the object store. ``reply``: ``value`` returns the result; ``reference`` puts it in
        the object store and returns only its reference, ``nothing`` drops it (``RayBackend.execute_by_reference``)."""
        args = tuple(_resolve(a) for a in args)
        kwargs = {k: _resolve(v) for k, v in kwargs.items()}
        result = getattr(self.worker, method)(*args, **kwargs)
        if reply == "reference":
            return StoredResult(ray.put(pack_tensors(result)))
        return None if reply == "nothing" else result


@dataclass(frozen=True)
class StoredResult:
    """A rank's result left in Ray's object store: what the driver holds instead of the data."""

    ref: ray.ObjectRef


_BUNDLE_SHARES: dict[Any, list[tuple[str, float]]] = {}
"""Placement group id -> (group name, share of each bundle) of the worker groups placed on it in this driver."""


def _claim_share(placement_group, share: float, *, name: str) -> None:
    """Colocated groups split each bundle: a group that would overfill it fails now, in one line, instead of
    waiting forever for resources its neighbours hold."""
    holders = _BUNDLE_SHARES.setdefault(placement_group.id, [])
    used = sum(part for _, part in holders)
    if used + share > 1.0 + 1e-9:
        taken = ", ".join(f"{holder} {part:g}" for holder, part in holders)
        raise ConfigError(f"worker group {name!r} asks for {share:g} of each bundle of a placement group already "
                          f"{used:g} used ({taken}): colocated groups must share each bundle, their shares "
                          "summing to at most 1")
    holders.append((name, share))


def _release_share(placement_group, name: str) -> None:
    holders = _BUNDLE_SHARES.get(placement_group.id, [])
    for i, (holder, _) in enumerate(holders):
        if holder == name:
            del holders[i]
            break
    if not holders:
        _BUNDLE_SHARES.pop(placement_group.id, None)


def _resolve(value: Any) -> Any:
    return unpack_tensors(ray.get(value)) if isinstance(value, ray.ObjectRef) else value


@dataclass(frozen=True)
class PackedTensor:
    """A CPU tensor as its raw bytes in a numpy array. Ray stores numpy arrays out of band, so a reader on the
    node maps them from shared memory; a pickled torch tensor is copied by the pickler and again by each
    reader's unpickler (``benchmarks/weight_sync.py``)."""

    data: Any  # np.ndarray of uint8
    dtype: torch.dtype
    shape: tuple[int, ...]

    @classmethod
    def of(cls, tensor: torch.Tensor) -> "PackedTensor":
        flat = tensor.detach().contiguous().reshape(-1)
        return cls(flat.view(torch.uint8).numpy(), tensor.dtype, tuple(tensor.shape))

    def unpack(self) -> torch.Tensor:
        """A private copy (the mapped object is read-only and shared by every reader)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "the given NumPy array is not writable": copied next
            return torch.from_numpy(self.data).view(self.dtype).reshape(self.shape).clone()


def pack_tensors(value: Any) -> Any:
    """A ``{name: tensor}`` dict's CPU tensors as ``PackedTensor`` (anything else unchanged)."""
    if isinstance(value, dict) and value and all(isinstance(v, torch.Tensor) and v.device.type == "cpu"
                                                 for v in value.values()):
        return {name: PackedTensor.of(tensor) for name, tensor in value.items()}
    return value


def unpack_tensors(value: Any) -> Any:
    if isinstance(value, dict) and value and all(isinstance(v, PackedTensor) for v in value.values()):
        return {name: packed.unpack() for name, packed in value.items()}
    return value


class RayBackend:
    """N ranks as Ray actors on a placement group (reserved here unless one is passed to share)."""

    def __init__(self, factory: Callable, *, name: str = "worker", pool: ResourcePool | None = None,
                 placement_group=None, share: float = 1.0, ray_address: str | None = None,
                 ray_num_cpus: float | None = None, ray_runtime_env: dict | None = None, timeout_s: float = 300.0,
                 concurrency: int = 1):
        connect_ray(address=ray_address, num_cpus=ray_num_cpus, runtime_env=ray_runtime_env)
        self.name, self.pool = name, pool or ResourcePool()
        self.world_size = self.pool.world_size
        self._owns_group = placement_group is None
        self.placement_group = placement_group or reserve(self.pool, timeout_s=timeout_s)
        self.share = share
        _claim_share(self.placement_group, share, name=name)
        self.concurrency = concurrency
        """Calls one rank runs at once, each in a thread: 2 for a rollout pool whose generate a weight sync pauses
        (partial rollouts); the worker then keeps its own state consistent (``EngineHandover``)."""
        self.actors = [self._spawn(rank, share) for rank in range(self.world_size)]
        self.locations = self._started(timeout_s)
        self._join()
        self._wait([actor.build.remote(factory) for actor in self.actors], method="build")

    def _spawn(self, rank: int, share: float):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        cpus, gpus = self.pool.cpus_per_proc * share, self.pool.gpus_per_proc * share
        strategy = PlacementGroupSchedulingStrategy(self.placement_group,
                                                    placement_group_bundle_index=self.pool.node_of(rank))
        threads = max(1, int(self.pool.cpus_per_proc))
        env = {"OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
        actor_cls = ray.remote(RankProcess).options(
            num_cpus=cpus, num_gpus=gpus, scheduling_strategy=strategy, name=None, max_concurrency=self.concurrency,
            runtime_env={"env_vars": env})
        return actor_cls.remote(rank=rank, world_size=self.world_size, threads=threads)

    def _started(self, timeout_s: float) -> list[tuple[str, int, str]]:
        """Each rank's location once its actor runs; an actor Ray cannot schedule fails after ``timeout_s``."""
        refs = [actor.location.remote() for actor in self.actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if len(ready) < len(refs):
            self.shutdown()
            raise ConfigError(f"worker group {self.name!r}: {len(refs) - len(ready)} of {len(refs)} workers did not "
                              f"start within {timeout_s:g}s (each asks for {self.share:g} of a bundle "
                              f"{self.pool.bundles()[0]}; free now: {ray.available_resources()}); free the resources "
                              "or lower trainer.n_gpus_per_node / ray_kwargs.cpus_per_worker")
        return ray.get(refs)

    def _join(self) -> None:
        master_addr, master_port = ray.get(self.actors[0].free_endpoint.remote())
        dist_backend = "nccl" if self.pool.gpus_per_proc else "gloo"
        joins = [actor.join.remote(master_addr=master_addr, master_port=master_port, dist_backend=dist_backend,
                                   local_rank=rank % self.pool.procs_per_node)
                 for rank, actor in enumerate(self.actors)]
        self._wait(joins, method="init_process_group")

    def execute(self, method: str, calls: list[Call]) -> list[Any]:
        refs = [actor.call.remote(method, args, kwargs) for actor, (args, kwargs) in zip(self.actors, calls)]
        return self._wait(refs, method=method)

    def execute_by_reference(self, method: str, calls: list[Call]) -> list[Any]:
        """Like ``execute``, but rank 0's result stays in the object store and only its reference comes back
        (a one-element list); the other ranks run the method too (it may be a collective) and drop theirs.
        Passed as an argument to another group's call, each of its ranks reads the object directly."""
        refs = [actor.call.remote(method, args, kwargs, reply="reference" if rank == 0 else "nothing")
                for rank, (actor, (args, kwargs)) in enumerate(zip(self.actors, calls))]
        return [self._wait(refs, method=method)[0].ref]

    def _wait(self, refs: list, *, method: str) -> list[Any]:
        """Results in rank order; the first failing rank tears the group down and is named."""
        pending, results = {ref: rank for rank, ref in enumerate(refs)}, [None] * len(refs)
        while pending:
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            rank = pending.pop(ref)
            try:
                results[rank] = ray.get(ref)
            except ray.exceptions.RayActorError as err:
                self._raise_died(rank, method, err)
            except ray.exceptions.RayTaskError as err:
                # A rank that lost its peer fails in a collective (gloo: "connection reset") before Ray reports
                # the peer's death: name the dead rank when there is one, not the survivor's symptom.
                self._raise_died_peer(pending, method)
                self.shutdown()
                if isinstance(err.cause, HybridflowError):
                    raise err.cause from None
                raise err.as_instanceof_cause() from None
        return results

    def _raise_died_peer(self, pending: dict, method: str, timeout_s: float = 30.0) -> None:
        """Raise ``WorkerDiedError`` for a rank among ``pending`` whose process died (waits up to ``timeout_s``)."""
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=timeout_s)
        for ref in ready:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as err:
                self._raise_died(pending[ref], method, err)
            except ray.exceptions.RayTaskError:
                continue

    def _raise_died(self, rank: int, method: str, err: Exception) -> None:
        self.shutdown()
        node, pid, node_id = self.locations[rank] if hasattr(self, "locations") else ("?", "?", "?")
        raise WorkerDiedError(
            f"worker group {self.name!r}: rank {rank} (pid {pid} on {node}, node "
            f"{self.pool.node_of(rank)} of {self.pool.nnodes}, Ray node id {node_id[:12]}) died during {method}(); "
            f"resume from the last checkpoint (trainer.resume_mode=auto) [{type(err).__name__}]") from err

    def shutdown(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for actor in getattr(self, "actors", []):
            ray.kill(actor, no_restart=True)
        self.actors = []
        group = getattr(self, "placement_group", None)
        if group is not None:
            _release_share(group, self.name)
            if self._owns_group:
                remove_placement_group(group)
        self.placement_group = None

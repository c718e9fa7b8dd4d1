"""Resource pools: how many worker processes, where, with what; and joining the Ray cluster.

A pool is ``nnodes`` bundles, one per node, each holding ``procs_per_node`` worker
processes (``trainer.nnodes`` x ``trainer.n_gpus_per_node``; on a CPU run that key counts
worker processes), reserved up front as one Ray placement group so that a group's ranks
are all scheduled or none is. Several nodes are spread strictly (``STRICT_SPREAD``: each
bundle on its own Ray node), so ranks ``k * procs_per_node ...`` share node ``k`` and its
fast local links; one node is one bundle, which Ray places on one machine. Roles that share
a pool share its bundles (colocation): each takes a fraction of a bundle's CPUs/GPUs, which
is how the hybrid engine's actor, rollout and reference live in one process and a critic can
sit beside them.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from hybridflow.errors import ConfigError


@dataclass(frozen=True)
class ResourcePool:
    """``nnodes x procs_per_node`` bundles of ``cpus_per_proc`` CPUs and ``gpus_per_proc`` GPUs."""

    nnodes: int = 1
    procs_per_node: int = 1
    cpus_per_proc: float = 1.0
    gpus_per_proc: float = 0.0

    def __post_init__(self):
        if self.nnodes < 1 or self.procs_per_node < 1:
            raise ConfigError(f"trainer.nnodes={self.nnodes}, trainer.n_gpus_per_node={self.procs_per_node}: "
                              "both must be >= 1")

    @property
    def world_size(self) -> int:
        return self.nnodes * self.procs_per_node

    def bundles(self) -> list[dict[str, float]]:
        """One bundle per node, with the resources of its ``procs_per_node`` processes."""
        bundle = {"CPU": self.cpus_per_proc * self.procs_per_node,
                  **({"GPU": self.gpus_per_proc * self.procs_per_node} if self.gpus_per_proc else {})}
        return [dict(bundle) for _ in range(self.nnodes)]

    def total(self) -> dict[str, float]:
        return {key: value * self.nnodes for key, value in self.bundles()[0].items()}

    def node_of(self, rank: int) -> int:
        """The bundle (node) index of ``rank``: ranks fill node 0, then node 1, ..."""
        return rank // self.procs_per_node

    @property
    def strategy(self) -> str:
        return "STRICT_SPREAD" if self.nnodes > 1 else "STRICT_PACK"


def pool_from_trainer_config(trainer_cfg, *, use_gpu: bool, cpus_per_proc: float = 1.0) -> ResourcePool:
    """The pool of ``trainer.nnodes`` x ``trainer.n_gpus_per_node`` processes."""
    return ResourcePool(nnodes=trainer_cfg.nnodes, procs_per_node=trainer_cfg.n_gpus_per_node,
                        cpus_per_proc=cpus_per_proc, gpus_per_proc=1.0 if use_gpu else 0.0)


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on an unreachable head node (ray.init itself retries for minutes)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # "auto" or a form Ray resolves itself
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise ConfigError(f"cannot reach the Ray cluster at {address} ({err}); start it with "
                          "`ray start --head` on that node or fix ray_kwargs.ray_init.address / RAY_ADDRESS") from err


def connect_ray(*, address: str | None = None, num_cpus: float | None = None, runtime_env: dict | None = None) -> None:
    """Join the cluster at ``address`` (or RAY_ADDRESS), else start a local one; no-op if connected.
    ``runtime_env`` is the job's (``ray_kwargs.ray_init.runtime_env``: env_vars, py_executable, ...)."""
    import ray

    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS") or None
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if address:
        check_reachable(address)
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=True, runtime_env=runtime_env or None)
        except ConnectionError as err:
            raise ConfigError(f"cannot connect to the Ray cluster at {address!r}: {err}; "
                              "run `ray start --head` first or unset RAY_ADDRESS to start a local one") from err
        return
    # address="local": a new local instance even when /tmp/ray/ray_current_cluster names another one (a
    # stale file from a crashed `ray start` or a test cluster would otherwise make ray.init join it and refuse
    # num_cpus)
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, runtime_env=runtime_env or None)


def check_capacity(pool: ResourcePool) -> None:
    """The cluster must be able to hold the pool at all; say what it has and what was asked."""
    import ray

    have = ray.cluster_resources()
    asked = pool.total()
    short = {key: value for key, value in asked.items() if have.get(key, 0.0) < value}
    if short:
        has = ", ".join(f"{k}={have.get(k, 0.0):g}" for k in asked)
        wants = ", ".join(f"{k}={v:g}" for k, v in asked.items())
        raise ConfigError(f"the Ray cluster has {has} but {pool.world_size} workers "
                          f"(trainer.nnodes={pool.nnodes} x trainer.n_gpus_per_node={pool.procs_per_node}) "
                          f"ask for {wants}; add nodes or lower trainer.n_gpus_per_node")


def wait_for_free(pool: ResourcePool, *, timeout_s: float) -> None:
    """The pool must fit in what is free now (other groups of the run hold their placement groups): a pool that
    does not fails in one line after a short grace for just-released groups, not after the long placement wait."""
    import time

    import ray

    deadline = time.monotonic() + timeout_s
    while True:
        free = ray.available_resources()
        short = {key: value for key, value in pool.total().items() if free.get(key, 0.0) + 1e-9 < value}
        if not short:
            return
        if time.monotonic() >= deadline:
            asked = ", ".join(f"{k}={v:g}" for k, v in pool.total().items())
            has = ", ".join(f"{k}={free.get(k, 0.0):g}" for k in short)
            raise ConfigError(f"a pool of {pool.world_size} workers asks for {asked} but only {has} is free (the "
                              "run's other worker groups hold the rest): lower rollout.n_gpus_per_node or "
                              "trainer.n_gpus_per_node, or give Ray more (ray_kwargs.ray_init.num_cpus, more nodes)")
        time.sleep(0.2)


def reserve(pool: ResourcePool, *, timeout_s: float = 60.0):
    """A ready placement group holding the pool's per-node bundles, each on its own node."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    check_capacity(pool)
    wait_for_free(pool, timeout_s=min(timeout_s, 10.0))
    group = placement_group(pool.bundles(), strategy=pool.strategy)
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(group)
        nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
        raise ConfigError(f"Ray could not place {pool.nnodes} node(s) x {pool.procs_per_node} workers "
                          f"({pool.bundles()[0]} on each of {pool.nnodes} distinct nodes; the cluster has {nodes} "
                          f"alive) within {timeout_s:g}s (available now: {ray.available_resources()}); "
                          "free the resources, add nodes or lower trainer.nnodes / trainer.n_gpus_per_node")
    return group

"""A worker group's ranks as a ``dp x sp`` grid: who shares data, who splits sequences.

With ``ulysses_sequence_parallel_size = S`` the ``W`` ranks of a group form ``W / S`` data-
parallel shards of ``S`` consecutive ranks each. The ``S`` ranks of a shard receive the same
rows (the worker group repeats each data shard ``S`` times, ``controller/worker_group.py``)
and split every packed row between them (``hybridflow.models.ulysses``). Parameters stay
FSDP2-sharded over all ``W`` ranks. A worker sees only the data-parallel view: world size
``W / S`` for batch arithmetic and global token counts over its data-parallel peers.
"""

from __future__ import annotations

from hybridflow.models.ulysses import SequenceParallel, build_sequence_parallel
from hybridflow.data.parallel import DataParallel


def split_world(world: DataParallel, *, sp_size: int, device_type: str,
                key: str) -> tuple[DataParallel, SequenceParallel | None]:
    """(data-parallel view, sequence-parallel group or None) of rank ``world.rank`` among
    ``world.world_size`` ranks; ``key`` names the config key in errors. One process (the local
    backend) has no peers: it runs whole sequences (the trainers warn about it)."""
    if world.world_size == 1:
        return world, None
    dp_size, dp_rank, dp_group, sp = build_sequence_parallel(world_size=world.world_size, rank=world.rank,
                                                             sp_size=sp_size, device_type=device_type, key=key)
    if sp is None:
        return world, None
    return DataParallel(world_size=dp_size, rank=dp_rank, group=dp_group), sp

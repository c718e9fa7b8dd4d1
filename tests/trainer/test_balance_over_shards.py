"""The PPO loop balances tokens over the actor group's data shards, not its ranks (fast tier: an
in-process backend that reports a world size, no Ray)."""

from __future__ import annotations

import pytest
import torch

from hybridflow.controller.worker_group import WorkerGroup
from hybridflow.data.batch import Batch
from hybridflow.trainer.loop.ppo_update import balance_over_shards
from hybridflow.trainer.roles.groups import HybridEngineWorker

LENGTHS = [10, 10, 10, 10, 1, 1, 1, 1]  # row order puts all long rows on the first shards


class _Ranks:
    """A backend of ``world_size`` ranks that is never called: balancing needs only the shard count."""

    def __init__(self, world_size: int):
        self.world_size = world_size

    def execute(self, method, calls):
        raise AssertionError("balancing must not call the workers")

    def shutdown(self):
        pass


def _batch() -> Batch:
    mask = torch.zeros(len(LENGTHS), max(LENGTHS), dtype=torch.long)
    for row, length in enumerate(LENGTHS):
        mask[row, :length] = 1
    return Batch({"attention_mask": mask, "row": torch.arange(len(LENGTHS))})


def _tokens_per_shard(batch: Batch, shards: int) -> list[int]:
    return [int(part["attention_mask"].sum()) for part in batch.chunk(shards)]


@pytest.mark.parametrize("world, sp, shards", [(4, 1, 4), (4, 2, 2), (2, 2, 1)])
def test_rows_are_balanced_for_the_data_shards(world, sp, shards):
    group = WorkerGroup(worker_cls=HybridEngineWorker, backend=_Ranks(world), ranks_per_shard=sp)
    batch = _batch()
    metrics = balance_over_shards(batch, group=group)
    if shards == 1:  # one shard (every rank of the sequence-parallel group holds it): row order untouched
        assert metrics == {} and batch["row"].tolist() == list(range(8))
        return
    total = sum(LENGTHS)
    assert _tokens_per_shard(batch, shards) == [total // shards] * shards
    assert sorted(batch["row"].tolist()) == list(range(8))  # a reordering: no row lost or repeated
    assert metrics["balance/tokens_max_over_min_after"] == 1.0
    assert metrics["balance/tokens_max_over_min_before"] > 1.0


def test_a_plain_worker_is_one_shard():
    batch = _batch()
    assert balance_over_shards(batch, group=object()) == {} and batch["row"].tolist() == list(range(8))

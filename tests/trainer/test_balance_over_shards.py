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


def test_a_loss_over_prompt_groups_keeps_each_group_in_one_shard():
    """GVPO (PolicyLossSpec.whole_groups): groups of 2 rows (uid) are balanced as units, their rows adjacent."""
    group = WorkerGroup(worker_cls=HybridEngineWorker, backend=_Ranks(2), ranks_per_shard=1)
    batch = _batch()
    # groups: p0 = rows 0, 4 (11 tokens), p1 = 1, 5 (11), p2 = 2, 3 (20), p3 = 6, 7 (2)
    batch["uid"] = ["p0", "p1", "p2", "p2", "p0", "p1", "p3", "p3"]
    metrics = balance_over_shards(batch, group=group, whole_groups=True)
    shards = batch.chunk(2)
    assert sorted(_tokens_per_shard(batch, 2)) == [22, 22]  # {p0, p1} and {p2, p3}
    for shard in shards:
        uids = list(shard["uid"])
        assert all(uids[i] == uids[i + 1] for i in range(0, 4, 2))  # each group's two rows adjacent
    assert {tuple(sorted(set(shard["uid"]))) for shard in shards} == {("p0", "p1"), ("p2", "p3")}
    assert metrics["balance/tokens_max_over_min_after"] == 1.0

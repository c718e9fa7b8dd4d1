"""A worker group with sequence parallelism: consecutive ranks share a data shard (no Ray)."""

from __future__ import annotations

import torch

from hybridflow.controller.dispatch import Mode, dispatch
from hybridflow.controller.worker_group import LocalBackend, WorkerGroup
from hybridflow.data.batch import Batch
from hybridflow.data.parallel import DataParallel


class Echo:
    def __init__(self, dp):
        self.dp = dp

    @dispatch(Mode.DP_COMPUTE)
    def rows(self, batch: Batch) -> torch.Tensor:
        return batch["x"] * 10 + self.dp.rank  # which rank answered, and for which rows

    @dispatch(Mode.ONE_TO_ALL)
    def rank(self) -> int:
        return self.dp.rank


class FourRanks:
    """Four in-process ranks, recording the rows each one was given."""

    world_size = 4

    def __init__(self):
        self.workers = [Echo(DataParallel(world_size=4, rank=r)) for r in range(4)]
        self.given: list[list[int]] = []

    def execute(self, method, calls):
        if method == "rows":
            self.given = [args[0]["x"].tolist() for args, _ in calls]
        return [getattr(w, method)(*args, **kwargs) for w, (args, kwargs) in zip(self.workers, calls)]

    def shutdown(self):
        pass


def test_each_shard_goes_to_its_sp_group_and_the_first_rank_answers():
    backend = FourRanks()
    group = WorkerGroup(worker_cls=Echo, backend=backend, ranks_per_shard=2)  # dp 2 x sp 2
    out = group.rows(Batch.from_dict(tensors={"x": torch.arange(4)}))
    assert backend.given == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert out.tolist() == [0, 10, 22, 32]  # rows 0-1 from rank 0, rows 2-3 from rank 2
    assert group.rank() == [0, 1, 2, 3]  # other modes still reach every rank once
    assert (group.world_size, group.data_parallel_size) == (4, 2)  # the trainer balances rows for 2 shards


def test_one_process_takes_everything_whatever_the_sp_size():
    group = WorkerGroup(worker_cls=Echo, backend=LocalBackend(Echo), ranks_per_shard=2)
    assert group.data_parallel_size == 1
    assert group.rows(Batch.from_dict(tensors={"x": torch.arange(4)})).tolist() == [0, 10, 20, 30]

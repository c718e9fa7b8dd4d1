"""Dispatch modes and collectors, and the local backend, on a toy worker (no Ray)."""

from __future__ import annotations

import pytest
import torch

from hybridflow.controller.dispatch import (
    DispatchSpec,
    Mode,
    SPLITTERS,
    concat_results,
    dispatch,
    dispatch_table,
    mean_metrics,
    register_dispatch_table,
)
from hybridflow.controller.worker_group import build_worker_group
from hybridflow.data.batch import Batch
from hybridflow.errors import ConfigError


class Doubler:
    def __init__(self, dp):
        self.dp = dp

    @dispatch(Mode.DP_COMPUTE)
    def double(self, batch: Batch, *, scale: float) -> tuple[torch.Tensor, Batch]:
        return batch["x"] * 2 * scale, batch.select(["x"])

    @dispatch(Mode.DP_COMPUTE, collect="mean")
    def stats(self, batch: Batch) -> dict[str, float]:
        return {"sum": float(batch["x"].sum())}

    @dispatch(Mode.RANK_ZERO)
    def whoami(self) -> int:
        return self.dp.rank

    def undeclared(self):
        return "never dispatched"


def batch_of(values) -> Batch:
    return Batch.from_dict(tensors={"x": torch.tensor(values, dtype=torch.float32)}, non_tensors={"i": list(values)})


def test_dp_compute_splits_batches_and_broadcasts_the_rest():
    calls = SPLITTERS[Mode.DP_COMPUTE]((batch_of([1, 2, 3, 4]),), {"scale": 0.5}, 2)
    assert [c[0][0]["x"].tolist() for c in calls] == [[1, 2], [3, 4]]
    assert [c[1]["scale"] for c in calls] == [0.5, 0.5]


def test_dp_compute_rejects_indivisible_batch_with_the_fix():
    with pytest.raises(ConfigError, match="multiple of 3"):
        SPLITTERS[Mode.DP_COMPUTE]((batch_of([1, 2, 3, 4]),), {}, 3)


def test_all_to_all_needs_one_value_per_rank():
    assert SPLITTERS[Mode.ALL_TO_ALL](([10, 20],), {"k": ["a", "b"]}, 2) == [((10,), {"k": "a"}), ((20,), {"k": "b"})]
    with pytest.raises(ValueError, match="list of 2 values"):
        SPLITTERS[Mode.ALL_TO_ALL](([10],), {}, 2)


def test_rank_zero_and_one_to_all_call_counts():
    assert len(SPLITTERS[Mode.RANK_ZERO]((1,), {}, 4)) == 1
    assert SPLITTERS[Mode.ONE_TO_ALL]((1,), {"a": 2}, 3) == [((1,), {"a": 2})] * 3


def test_concat_collects_in_rank_order_elementwise():
    tensors, batches = concat_results([(torch.tensor([1.0]), batch_of([1])), (torch.tensor([2.0]), batch_of([2]))])
    assert tensors.tolist() == [1.0, 2.0]
    assert batches["x"].tolist() == [1.0, 2.0] and list(batches["i"]) == [1, 2]


def test_mean_metrics_averages_over_the_ranks_that_report_a_key():
    merged = mean_metrics([{"loss": 1.0, "only0": 4.0}, {"loss": 3.0}])
    assert merged == {"loss": (1.0 + 3.0) / 2, "only0": 4.0}


def test_local_group_equals_calling_the_worker():
    group = build_worker_group(Doubler, worker_cls=Doubler, backend="local")
    values, selected = group.double(batch_of([1, 2, 3]), scale=3.0)
    assert values.tolist() == [6.0, 12.0, 18.0]
    assert selected.keys() == ["x"]
    assert group.stats(batch_of([1, 2, 3])) == {"sum": 6.0}
    assert group.whoami() == 0 and group.world_size == 1


def test_undeclared_method_is_not_dispatched():
    group = build_worker_group(Doubler, worker_cls=Doubler, backend="local", name="doubler")
    with pytest.raises(AttributeError, match="doubler group has no dispatched method 'undeclared'; declared: double"):
        group.undeclared()


def test_tables_declare_methods_of_classes_without_decorators():
    class Plain:
        def run(self, batch):
            return batch

    register_dispatch_table(Plain, {"run": DispatchSpec(Mode.DP_COMPUTE, "concat")})

    class Child(Plain):
        @dispatch(Mode.ONE_TO_ALL)
        def extra(self):
            return None

    assert dispatch_table(Child) == {"run": DispatchSpec(Mode.DP_COMPUTE, "concat"),
                                     "extra": DispatchSpec(Mode.ONE_TO_ALL, "list")}


def test_unknown_backend_and_collector_name_the_choices():
    with pytest.raises(ConfigError, match="choose from local, ray"):
        build_worker_group(Doubler, worker_cls=Doubler, backend="mpi")
    with pytest.raises(ValueError, match="unknown collector 'sum'"):
        dispatch(Mode.DP_COMPUTE, collect="sum")


def test_role_tables_cover_the_loop_methods():
    """The group workers (the only classes built as groups) declare every method the loops call."""
    from hybridflow.trainer.roles.groups import CriticGroupWorker, HybridEngineWorker

    engine = dispatch_table(HybridEngineWorker)
    assert engine["update_policy"] == DispatchSpec(Mode.DP_COMPUTE, "mean")
    assert engine["compute_log_prob"] == DispatchSpec(Mode.DP_COMPUTE, "concat")
    assert engine["sync_rollout_weights"] == DispatchSpec(Mode.ONE_TO_ALL, "first")
    assert "named_weights" not in engine
    critic = dispatch_table(CriticGroupWorker)
    assert critic["compute_values"] == DispatchSpec(Mode.DP_COMPUTE, "concat")
    assert critic["update_critic"] == DispatchSpec(Mode.DP_COMPUTE, "mean")

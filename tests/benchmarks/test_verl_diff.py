"""The differential check's judgement (benchmarks/verl_diff.py): what passes and what fails, on hand-made results.

The check itself needs verl 0.9.1 in a side venv and a minute a case (``make verl-diff``); these tests keep
its comparison honest: a gradient or weight off by more than its tolerance fails, AdamW's eps-amplified
elements are left out only where some step's gradient is tiny on both sides, a metric verl logs and hybridflow
does not is a failure, and the step count must agree."""

from __future__ import annotations

import pytest
import torch

from tests.benchmarks.loader import loaded_benchmark


@pytest.fixture(scope="module")
def verl_diff():
    with loaded_benchmark("verl_diff") as module:
        yield module


def result(weights: dict, grads: list[dict], metrics: dict | None = None, dtypes=("float32",)) -> dict:
    return {"weights": weights, "applied": grads, "metrics": metrics or {"actor/pg_loss": 0.5}, "dtypes": list(dtypes)}


def case(verl_diff):
    return verl_diff.Case(keys=[], what="hand-made")


def test_equal_results_pass_with_zero_differences(verl_diff):
    grads = [{"w": torch.tensor([0.1, -0.2, 0.0])}]
    row = verl_diff.judge(case(verl_diff), result({"w": torch.tensor([1.0, 2.0, 3.0])}, grads),
                          result({"w": torch.tensor([1.0, 2.0, 3.0])}, grads))
    assert row["pass"] and row["grad"] == 0.0 and row["weight"] == 0.0 and row["eps_excluded"] == 0


def test_a_gradient_or_weight_beyond_its_tolerance_fails(verl_diff):
    grads = [{"w": torch.tensor([0.1, -0.2])}]
    off_grad = [{"w": torch.tensor([0.1 + 2e-5, -0.2])}]
    row = verl_diff.judge(case(verl_diff), result({"w": torch.tensor([1.0, 2.0])}, grads),
                          result({"w": torch.tensor([1.0, 2.0])}, off_grad))
    assert not row["pass"] and "gradients differ by 2.00e-05" in row["note"]
    row = verl_diff.judge(case(verl_diff), result({"w": torch.tensor([1.0, 2.0])}, grads),
                          result({"w": torch.tensor([1.0, 2.0 + 4e-6])}, grads))
    assert not row["pass"] and row["weight"] > 1e-6 and "weights differ" in row["note"]


def test_only_elements_with_a_tiny_gradient_on_both_sides_are_left_out(verl_diff):
    """Element 0: a 1e-8 gradient at step 2 (AdamW divides it by ~eps): its weight may differ. Element 1: a
    tiny gradient on one side only; element 2: exactly 0 on both (moves by the decay only): both still count."""
    verl_grads = [{"w": torch.tensor([0.1, 0.1, 0.0])}, {"w": torch.tensor([1e-8, 3e-7, 0.0])}]
    our_grads = [{"w": torch.tensor([0.1, 0.1, 0.0])}, {"w": torch.tensor([2e-8, 3e-6, 0.0])}]
    sensitive = verl_diff.eps_sensitive("w", verl_grads, our_grads, (3,))
    assert sensitive.tolist() == [True, False, False]
    row = verl_diff.judge(case(verl_diff), result({"w": torch.tensor([1.0, 2.0, 3.0])}, verl_grads),
                          result({"w": torch.tensor([1.0 + 1e-4, 2.0, 3.0])}, our_grads))
    assert row["eps_excluded"] == 1 and row["weight"] == 0.0
    row = verl_diff.judge(case(verl_diff), result({"w": torch.tensor([1.0, 2.0, 3.0])}, verl_grads),
                          result({"w": torch.tensor([1.0, 2.0, 3.0 + 1e-4])}, our_grads))
    assert not row["pass"]


def test_metric_names_and_values_follow_verl(verl_diff):
    grads = [{"w": torch.tensor([0.1])}]
    weights = {"w": torch.tensor([1.0])}
    verl_metrics = {"actor/pg_loss": 0.5, "actor/entropy_loss": 2.0, "actor/perf/max_memory_allocated_gb": 0.0}
    row = verl_diff.judge(case(verl_diff), result(weights, grads, verl_metrics),
                          result(weights, grads, {"actor/pg_loss": 0.5, "actor/entropy": 2.0}))
    assert not row["pass"] and row["note"] == "hybridflow does not log actor/entropy_loss"
    row = verl_diff.judge(case(verl_diff), result(weights, grads, verl_metrics),
                          result(weights, grads, {"actor/pg_loss": 0.5001, "actor/entropy_loss": 2.0}))
    assert not row["pass"] and "actor/pg_loss 0.5001 vs verl 0.5" in row["note"]


def test_a_different_number_of_optimizer_steps_fails(verl_diff):
    weights = {"w": torch.tensor([1.0])}
    grads = {"w": torch.tensor([0.1])}
    row = verl_diff.judge(case(verl_diff), result(weights, [grads, grads]), result(weights, [grads]))
    assert not row["pass"] and "1 optimizer steps, verl took 2" in row["note"]

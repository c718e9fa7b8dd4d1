"""benchmarks/recipe_ablation.py: run names, the report's table and the exported curves, from metrics files."""

import json
from pathlib import Path

import pytest

from tests.benchmarks.loader import loaded_benchmark


@pytest.fixture(scope="module")
def ablation():
    with loaded_benchmark("recipe_ablation") as module:
        yield module


def write_run(out: Path, name: str, rows: list[dict]) -> None:
    logs = out / "runs" / name / "logs"
    logs.mkdir(parents=True)
    (logs / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_run_names_whose_arm_holds_dots_are_read_back(ablation):
    assert ablation.parse_run("chain_sum_3x2.recipe-t0.6.s12") == {"task": "chain_sum_3x2", "arm": "recipe-t0.6",
                                                                   "seed": 12}
    assert {"recipe-t0.6", "entropy", "dynamic"} <= set(ablation.ARMS)


def test_the_report_averages_seeds_per_validation_step_and_the_export_keeps_the_curves(ablation, tmp_path):
    for seed, late in ((1, 0.3), (2, 0.5)):
        write_run(tmp_path, f"chain_sum_3x2.recipe-t0.6.s{seed}", [
            {"step": 0, "val-core/chain_sum/reward/mean@1": 0.1},
            {"step": 1, "critic/score/mean": 0.25, "actor/entropy": 2.0},
            {"step": 2, "critic/score/mean": 0.5, "actor/entropy": 1.0, "val-core/chain_sum/reward/mean@1": late}])
    table = ablation.report(tmp_path)
    assert "chain_sum_3x2 / recipe-t0.6: 0: 0.100±0.000 (n=2) | 2: 0.400±0.141 (n=2)" in table
    assert "best per seed [(2, 0.3), (2, 0.5)]" in table and "entropy of the last 10 steps [1.5, 1.5]" in table
    ablation.export(tmp_path, tmp_path / "curves.json")
    curves = json.loads((tmp_path / "curves.json").read_text())["chain_sum_3x2.recipe-t0.6.s2"]
    assert curves["arm"] == "recipe-t0.6" and curves["seed"] == 2
    assert curves["held_out"] == {"0": 0.1, "2": 0.5}
    assert curves["per_step"] == {"critic/score/mean": [0.25, 0.5], "actor/entropy": [2.0, 1.0]}

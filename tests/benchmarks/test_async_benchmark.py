"""benchmarks/async.py: the table's arithmetic, and sync vs sync_pair end to end on a tiny model."""

import subprocess
import sys

import pytest

from tests.benchmarks.loader import BENCHMARKS, loaded_benchmark


@pytest.fixture(scope="module")
def bench():
    with loaded_benchmark("async") as module:
        yield module


def rows(steps: int, *, seconds: float, tokens: int) -> list[dict]:
    return [{"step": s, "timing_s/step": seconds, "timing_s/gen": 1.0, "timing_s/update_actor": 2.0,
             "perf/total_num_tokens": tokens, "critic/score/mean": 0.5} for s in range(1, steps + 1)]


def test_a_pair_counts_the_steps_and_tokens_of_both_runs_and_skips_each_runs_warm_up(bench):
    # two runs of 3 steps in 60 s of wall time; each run's step 1 (a warm-up, 100 s) is left out
    both = rows(3, seconds=10.0, tokens=100) + rows(3, seconds=10.0, tokens=100)
    both[0]["timing_s/step"] = both[3]["timing_s/step"] = 100.0
    line = bench.summarise("sync_pair", "sync_pair", 60.0, both)
    assert line["steps_per_hour"] == pytest.approx(3600 * 6 / 60)
    assert line["step_s"] == 10.0
    # 4 measured steps of 100 tokens in 40 s of one process's time, two processes side by side
    assert line["trained_tok_s"] == pytest.approx(2 * 400 / 40)
    single = bench.summarise("sync", "sync", 60.0, rows(3, seconds=10.0, tokens=100))
    assert single["trained_tok_s"] == pytest.approx(200 / 20)


def test_async_benchmark_runs_sync_and_the_pair_and_compares_them(tmp_path):
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / "async.py"), "--model", "tiny", "--length", "8", "--steps", "2",
         "--modes", "sync,sync_pair", "--out", str(tmp_path)],
        check=True, capture_output=True, text=True, timeout=600).stdout
    table = out[out.index("mode "):].splitlines()
    assert table[1].startswith("sync ") and "1.00x" in table[1]
    assert table[2].startswith("sync_pair ")
    for name in ("a", "b"):  # both runs of the pair wrote their metrics
        assert (tmp_path / "sync_pair" / name / "logs" / "metrics.jsonl").exists()

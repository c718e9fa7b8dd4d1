"""benchmarks/grpo_step.py: the hybridflow side end to end on a tiny model (TRL is an optional extra)."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "grpo_step.py"


def test_grpo_step_benchmark_runs_and_reports_the_layout(tmp_path):
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "tiny", "--frameworks", "hybridflow", "--layouts", "shared",
         "--lengths", "8", "--steps", "2", "--rounds", "1", "--precisions", "fp32,bf16", "--out", str(tmp_path)],
        check=True, capture_output=True, text=True, timeout=600).stdout
    assert "cpu: " in out and "ISA" in out
    for run in ("shared/fp32", "shared/bf16"):  # each precision its own row, against its own matmul rate
        assert f"| hybridflow/{run} |" in out
        assert f"hybridflow/{run}: update " in out and "GFLOP/s over all" in out and "floor" in out
    assert "measured now: fp32 " in out and ", bf16 " in out

"""benchmarks/grpo_step.py: the hybridflow side end to end on a tiny model (TRL is an optional extra)."""

import os
import subprocess
import sys
from pathlib import Path

from hybridflow import omp

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
    assert "OpenMP: hybridflow and trl-tuned: " in out


def test_plain_trl_runs_as_launched_and_tuned_trl_gets_hybridflows_cpu_settings(monkeypatch):
    """Plain TRL must not inherit the wait policy `import hybridflow` chose for the benchmark's own process."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import grpo_step
    finally:
        sys.path.remove(str(SCRIPT.parent))
    monkeypatch.setattr(grpo_step, "LAUNCH_ENV", {})
    monkeypatch.setenv("GOMP_SPINCOUNT", "30000")  # as if hybridflow.omp chose to spin
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    plain, tuned = grpo_step.plain_env(), grpo_step.tuned_env()
    assert "GOMP_SPINCOUNT" not in plain and "OMP_WAIT_POLICY" not in plain and plain["THP_MEM_ALLOC_ENABLE"] == "0"
    assert tuned["GOMP_SPINCOUNT"] == "30000" and tuned["THP_MEM_ALLOC_ENABLE"] == "1"
    monkeypatch.setattr(grpo_step, "LAUNCH_ENV", {"OMP_WAIT_POLICY": "PASSIVE"})  # the user's own choice: kept
    assert grpo_step.plain_env()["OMP_WAIT_POLICY"] == "PASSIVE"


def test_the_trl_worker_loads_the_script_without_choosing_a_wait_policy():
    """The TRL worker runs this file: importing it must leave OpenMP's variables as the process was started with,
    since its torch (libgomp) loads before anything imports hybridflow."""
    env = {k: v for k, v in os.environ.items() if k not in (*omp.POLICY_VARS, omp.MARK)}
    code = (f"import os, sys; sys.path.insert(0, {str(SCRIPT.parent)!r}); import grpo_step; "
            "print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'), 'hybridflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["None", "None", "False"]

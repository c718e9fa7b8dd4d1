"""benchmarks/optimizer_step.py end to end on a tiny model: every implementation timed, same weights."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "optimizer_step.py"


def test_optimizer_benchmark_times_each_implementation_and_checks_they_agree():
    out = subprocess.run([sys.executable, str(SCRIPT), "--model", "tiny", "--repeats", "1"], check=True,
                         capture_output=True, text=True, timeout=300).stdout
    assert "ISA" in out and "floor" in out
    for name in ("fused", "foreach", "for-loop"):
        assert f"max |{name} - for-loop| after 2 steps: " in out
        diff = float(out.split(f"max |{name} - for-loop| after 2 steps: ")[1].split()[0])
        assert diff < 1e-6

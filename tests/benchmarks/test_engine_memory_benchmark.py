"""benchmarks/engine_memory.py end to end on a tiny model: both variants measured, the floor printed."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "engine_memory.py"


def test_engine_memory_benchmark_measures_both_variants():
    out = subprocess.run([sys.executable, str(SCRIPT), "--model", "tiny", "--syncs", "2"], check=True,
                         capture_output=True, text=True, timeout=300).stdout
    assert "ISA" in out and out.count("floor: ") == 2
    assert "shared build: +" in out and "own    build: +" in out and out.count("sync 2: +") == 2

"""benchmarks/logprob_head.py on a tiny head: both paths timed, on each thread count asked (in a subprocess: the
script changes glibc's malloc settings for its process)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.models import logprob_kernel

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(logprob_kernel.unavailable_reason() is not None, reason="no log-prob head kernel here")
def test_the_head_benchmark_times_both_paths():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "logprob_head.py"), "--rows", "5", "--vocab",
                          "100", "--threads", "1,2", "--repeats", "1"], check=True, capture_output=True, text=True,
                         timeout=300, env=env).stdout
    lines = out.splitlines()
    assert len(lines) == 4 and all("torch" in line and "kernel" in line for line in lines)

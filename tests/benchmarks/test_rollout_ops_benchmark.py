"""benchmarks/rollout_ops.py: the op-count A/B sees a change in the work a generate does, and none between equal trees."""

import shutil
import subprocess
import sys
from pathlib import Path

from tests.benchmarks.loader import BENCHMARKS, loaded_benchmark

ROOT = BENCHMARKS.parent
EXTRA_OP = """
_generate = NativeEngine.generate
NativeEngine.generate = lambda self, *args, **kwargs: (torch.ones(7).neg(), _generate(self, *args, **kwargs))[1]
"""
TINY = ["--shape", "tiny-llama", "--batch", "3", "--prompt-len", "5", "--max-tokens", "4"]


def test_differences_lists_changed_counts_largest_first():
    with loaded_benchmark("rollout_ops") as bench:
        rows = bench.differences({"mm [[2, 3]]": 4, "add []": 1, "mul []": 2}, {"mm [[2, 3]]": 7, "mul []": 2})
    assert rows == [("mm [[2, 3]]", 4, 7), ("add []", 1, 0)]


def _tree_copy(tmp_path: Path) -> Path:
    """A copy of this checkout's package whose ``NativeEngine.generate`` runs one extra ``aten::neg``."""
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "hybridflow", tree / "hybridflow", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copytree(BENCHMARKS, tree / "benchmarks", ignore=shutil.ignore_patterns("__pycache__"))
    native = tree / "hybridflow/rollout/native.py"
    native.write_text(native.read_text() + EXTRA_OP)
    return tree


def test_equal_trees_agree_and_a_changed_tree_shows_its_extra_ops(tmp_path: Path):
    changed = _tree_copy(tmp_path)
    command = [sys.executable, str(BENCHMARKS / "rollout_ops.py"), "--trees", str(ROOT), str(ROOT), str(changed), *TINY]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    assert f"\n0 op signatures differ between {ROOT} and {ROOT}\n" in out, out
    assert f"\n4 op signatures differ between {ROOT} and {changed}\n" in out, out  # ones = empty + fill_, neg
    assert "0 ->        1  aten::neg [[7]]" in out, out

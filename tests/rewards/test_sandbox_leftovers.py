"""What a finished sample leaves is cleaned off its critical path, and nothing is left at exit (issue 61).

The host folders of sandboxes go to a remover thread, the killed sandbox and judge of an assert sample
are reaped at the next sample's start; ``sandbox_leftovers.finish`` (run at exit) ends both. The pure
standard modules a test may use are imported once in the reward process, not again in each judge.
"""

import glob
import os
import sys
import tempfile

import pytest

from hybridflow.rewards import code_sandbox, judge_process, sandbox_judge, sandbox_leftovers
from hybridflow.rewards.code_sandbox import run_asserts, run_python

pytestmark = pytest.mark.skipif(
    not code_sandbox.sandbox_available(),
    reason=f"no working sandbox here ({code_sandbox.bwrap_problem()}); `make sandbox` installs bubblewrap",
)
RIGHT = "def add(a, b):\n    return a + b\n"


def _our_folders() -> list[str]:
    return glob.glob(os.path.join(tempfile.gettempdir(), f"{sandbox_leftovers.PREFIX}{os.getpid()}-*"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_killed_processes_are_reaped_and_folders_removed_by_finish():
    for _ in range(3):
        assert run_asserts(RIGHT, ["assert add(2, 3) == 5"]) == [True]
    assert run_python("print(5)").stdout == "5\n"
    waiting = [p if isinstance(p, int) else p.pid for p in sandbox_leftovers._KILLED]
    assert len(waiting) <= 4  # reaped at each start: the last sample's sandbox and judge, not all of them
    sandbox_leftovers.finish()
    assert sandbox_leftovers._KILLED == []
    assert [pid for pid in waiting if _alive(pid)] == []  # reaped: not even a zombie
    assert _our_folders() == []


def test_a_test_s_pure_modules_are_imported_once_here_not_in_each_judge():
    judge_process._import_pure_modules.cache_clear()
    sys.modules.pop("statistics", None)
    tests = ["import statistics\nassert statistics.median([add(1, 1), 5, 1]) == 2"]
    assert run_asserts(RIGHT, tests) == [True]
    assert "statistics" in sys.modules and sandbox_judge.PURE_MODULES <= set(sys.modules)

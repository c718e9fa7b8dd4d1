"""A judge judges many samples, and nothing of one sample reaches the next (issue 61).

The judge server's judges are persistent: a judge is kept for a later sample only after it reported every
entry of a sample within that sample's bounds, said it is ready, and its memory stayed within
``judge_process.GROWTH_MB`` of what it had when forked; each sample sets its own ``RLIMIT_AS`` and
``RLIMIT_CPU``. Each test runs two samples and checks which judge judged the second and how.
"""

import os
import select
import signal
import warnings

import pytest

from hybridflow.rewards import code_sandbox, judge_server
from hybridflow.rewards.code_sandbox import run_asserts

pytestmark = pytest.mark.skipif(
    not code_sandbox.sandbox_available(),
    reason=f"no working sandbox here ({code_sandbox.bwrap_problem()}); `make sandbox` installs bubblewrap",
)
RIGHT = "def add(a, b):\n    return a + b\n"
TESTS = ["assert add(2, 3) == 5", "assert add(2, 2) == 5"]


def _pid(judge: judge_server.Judge) -> int:
    with open(f"/proc/self/fdinfo/{judge.pidfd}") as handle:
        return int(next(line for line in handle if line.startswith("Pid:")).split()[1])


@pytest.fixture
def judges(monkeypatch):
    """[(pid, a pidfd of our own)] of the judge each sample got from :func:`judge_server.acquire`, in order."""
    judge_server.retire_all()
    got: list[tuple[int, int]] = []
    acquire = judge_server.acquire

    def recorded():
        judge = acquire()
        got.append((_pid(judge), os.dup(judge.pidfd)))
        return judge

    monkeypatch.setattr(judge_server, "acquire", recorded)
    yield got
    for _, pidfd in got:
        os.close(pidfd)


def _ended(pidfd: int, within_s: float = 10.0) -> bool:
    return select.select([pidfd], [], [], within_s)[0] == [pidfd]


def test_a_judge_judges_the_samples_after_a_clean_one(judges):
    assert [run_asserts(RIGHT, TESTS) for _ in range(3)] == [[True, False]] * 3
    assert len({pid for pid, _ in judges}) == 1  # no fork per sample
    server = next(s for s in judge_server._SERVERS if s.pid == os.getpid())
    assert run_asserts(RIGHT, [f"import os\nassert os.getppid() == {server.process.pid}"]) == [True]


def test_a_judge_past_a_bound_is_killed_and_the_next_sample_is_judged_by_another(judges):
    # 70k integers sharing one hash: the test's set(...) is quadratic in the judge (31-54 s), cut at the 1 s entry
    colliding = "def add(a, b):\n    return [k * (2**61 - 1) + 1 for k in range(70000)]\n"
    assert run_asserts(colliding, ["assert set(add(1, 2)) == {1}"], timeout_s=1.0) == [False]
    assert judges[0][0] not in [_pid(judge) for judge in judge_server._IDLE]  # never kept for another sample
    assert _ended(judges[0][1])  # killed at the bound (its own RLIMIT_CPU would end it too, later)
    failures = judge_server.FAILURES[0]
    assert run_asserts(RIGHT, TESTS) == [True, False]
    assert judges[1][0] != judges[0][0] and judge_server.FAILURES[0] == failures


def test_a_judge_that_grew_is_not_reused(judges):
    # the program's pattern is compiled, and kept in `re`'s module cache, in the judge: ~25 MB a sample that
    # would pile up there sample after sample (an honest sample's judge would run out of its RLIMIT_AS)
    pinning = "def add(a, b):\n    return 'x' * 1_500_000\n"
    assert run_asserts(pinning, ["import re\nassert re.findall(add(1, 2), 'x') == []"], timeout_s=30.0) == [True]
    assert _ended(judges[0][1])  # it ended instead of saying ready
    assert run_asserts(RIGHT, TESTS) == [True, False]
    assert judges[1][0] != judges[0][0]


def test_each_sample_sets_its_own_clock_and_memory_in_a_reused_judge(judges):
    def limits_are(memory_mb: int, sample_s: float) -> list[str]:  # the judge's limits, checked in the judge
        return ["import resource\nassert "  # what the judge had when forked (~20-40 MB) + memory_mb
                f"{memory_mb * 2**20} < resource.getrlimit(resource.RLIMIT_AS)[0] < {(memory_mb + 128) * 2**20}",
                "import resource\nassert (lambda cpu: "
                f"cpu + {sample_s} <= resource.getrlimit(resource.RLIMIT_CPU)[0] <= cpu + {sample_s} + 2)"
                "(sum(resource.getrusage(resource.RUSAGE_SELF)[:2]))"]  # fmt: skip

    assert run_asserts(RIGHT, limits_are(2048, 30.0), timeout_s=10.0, memory_mb=2048) == [True, True]
    assert run_asserts(RIGHT, limits_are(256, 3.0), timeout_s=1.0, memory_mb=256) == [True, True]
    assert run_asserts(RIGHT, limits_are(2048, 30.0), timeout_s=10.0, memory_mb=2048) == [True, True]
    assert len({pid for pid, _ in judges}) == 1


def test_a_judge_that_died_idle_is_replaced_without_a_failure(judges):
    assert run_asserts(RIGHT, TESTS) == [True, False]
    os.kill(judges[0][0], signal.SIGKILL)  # as the kernel's OOM killer would, between two samples
    assert _ended(judges[0][1])
    failures = judge_server.FAILURES[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # not a failure: no warning
        assert run_asserts(RIGHT, TESTS) == [True, False]
    assert judges[1][0] != judges[0][0] and judge_server.FAILURES[0] == failures


def test_the_judges_of_a_lost_server_are_not_used(judges):
    # a server this process lost ends, and its judges with it, whenever it next runs: none of them gets a sample
    assert run_asserts(RIGHT, TESTS) == [True, False]
    server = next(s for s in judge_server._SERVERS if s.pid == os.getpid())
    os.kill(server.process.pid, signal.SIGSTOP)  # not running yet: its judges are still alive
    server.sock.close()
    try:
        assert run_asserts(RIGHT, TESTS) == [True, False]  # judged by a new judge of a new server
        assert judges[1][0] != judges[0][0]
    finally:
        server.process.kill()
        server.process.wait()
    assert _ended(judges[0][1])

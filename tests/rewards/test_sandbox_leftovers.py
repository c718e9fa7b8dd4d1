"""What a finished sample leaves is cleaned off its critical path, and nothing is left at exit (issue 61).

The host folders of sandboxes go to a remover thread, the killed sandbox (and a killed judge) of an assert
sample are reaped at the next sample's start; ``sandbox_leftovers.finish`` (run at exit) ends both. The pure
standard modules a test may use are imported once in the reward process, not again in each judge.
"""

import glob
import os
import select
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from hybridflow.rewards import code_sandbox, judge_process, judge_server, sandbox_judge, sandbox_leftovers
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
    judge_process.import_pure_modules.cache_clear()
    sys.modules.pop("statistics", None)
    tests = ["import statistics\nassert statistics.median([add(1, 1), 5, 1]) == 2"]
    assert run_asserts(RIGHT, tests) == [True]
    assert "statistics" in sys.modules and sandbox_judge.PURE_MODULES <= set(sys.modules)


# ------------------------------------------------------------------ the judge server
def _judge_parent_is(pid: int) -> bool:
    """Whether this sample's judge process is a child of ``pid`` (the entry runs in the judge)."""
    return run_asserts(RIGHT, [f"import os\nassert os.getppid() == {pid} and add(1, 2) == 3"]) == [True]


def test_judges_are_forked_by_the_server_and_here_without_one(monkeypatch):
    assert run_asserts(RIGHT, ["assert add(2, 3) == 5"]) == [True]
    server = next(s for s in judge_server._SERVERS if s.pid == os.getpid())
    assert _judge_parent_is(server.process.pid)  # not a fork of this (maybe torch-sized) process
    monkeypatch.setattr(judge_server, "acquire", lambda: None)  # no server here: forked by us
    assert _judge_parent_is(os.getpid())


def test_a_killed_server_is_started_again():
    assert run_asserts(RIGHT, ["assert add(2, 3) == 5"]) == [True]
    server = next(s for s in judge_server._SERVERS if s.pid == os.getpid())
    server.process.kill()
    server.process.wait()
    assert run_asserts(RIGHT, ["assert add(2, 3) == 5", "assert add(2, 2) == 5"]) == [True, False]
    again = next(s for s in judge_server._SERVERS if s.pid == os.getpid())
    assert again is not server and again.process.poll() is None


def test_a_stopped_server_is_replaced_counted_and_said(monkeypatch):
    # a server that never answers (SIGSTOPped) costs the sample its answer time-out, not the run: it is killed,
    # replaced, and the failure counted and said in one line (asked only for a new judge: the idle ones retired)
    assert run_asserts(RIGHT, ["assert add(2, 3) == 5"]) == [True]
    judge_server.retire_all()
    server = next(s for s in judge_server._SERVERS if s.pid == os.getpid())
    server.sock.settimeout(1.0)
    os.kill(server.process.pid, signal.SIGSTOP)
    failures = judge_server.FAILURES[0]
    with pytest.warns(RuntimeWarning, match="judge server failed"):
        assert run_asserts(RIGHT, ["assert add(2, 3) == 5", "assert add(2, 2) == 5"]) == [True, False]
    assert judge_server.FAILURES[0] == failures + 1
    assert server.process.poll() is not None  # the stopped one was killed
    assert run_asserts(RIGHT, ["assert add(2, 3) == 5"]) == [True]  # the next sample starts a new server
    again = next(s for s in judge_server._SERVERS if s.pid == os.getpid())
    assert again is not server and _judge_parent_is(again.process.pid)


def test_a_server_that_always_fails_leaves_the_judge_to_this_process(monkeypatch):
    receive = judge_server._receive

    lost: list[int] = []  # the socket ends and pidfds of the judges whose server's answer was lost

    def answer_lost(sock, max_fds):  # the server forked a judge, and its answer is lost on the way
        lost.extend(receive(sock, max_fds)[1])
        raise ConnectionResetError("answer lost")

    judge_server.retire_all()  # every sample asks the server for a new judge
    monkeypatch.setattr(judge_server, "_receive", answer_lost)  # our side of every conversation: all servers fail
    failures = judge_server.FAILURES[0]
    for sample in range(2):
        with pytest.warns(RuntimeWarning, match="judge server failed") as said:
            # judged all the same by a judge forked here and by it alone: the judge the killed server forked died
            # with it and never had this sample (it would fail the parent test)
            assert _judge_parent_is(os.getpid())
        assert judge_server.FAILURES[0] == failures + sample + 1 and len(said) == 1  # each sample: a new server
    for fd in lost:  # the judges of the killed servers ended with their server (their socket and pidfd say so)
        assert select.select([fd], [], [], 4.0)[0] == [fd]
        os.close(fd)
    assert len(lost) == 4


ENDLESS_JUDGE = """
from hybridflow.rewards.code_sandbox import run_asserts
run_asserts("from math import factorial\\ndef n():\\n    return 10**8\\n", ["assert factorial(n()) > 0"], timeout_s=30.0)
"""  # factorial(10**8) in the judge: minutes of CPU, cut at the entry's 30 s by a reward process alive


def _live_processes_in_group(pgid: int) -> dict[int, int]:
    """{pid: parent pid} of the live processes of process group ``pgid``."""
    found = {}
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found[int(entry)] = int(fields[1])
    return found


def _judges(reward_pid: int) -> list[int]:
    """The judges of ``reward_pid``: its group's grandchildren (forked by its judge server)."""
    group = _live_processes_in_group(reward_pid)
    return [pid for pid, parent in group.items() if parent in group and parent != reward_pid]


def test_judges_die_with_a_killed_reward_process():
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    process = subprocess.Popen([sys.executable, "-c", ENDLESS_JUDGE], env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while not _judges(process.pid) and time.monotonic() < deadline:
        time.sleep(0.1)  # the reward process, its judge server and the judge (the sandbox has its own session)
    assert _judges(process.pid)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 20  # the judge's own CPU limit would end it only after ~60 s
    while _live_processes_in_group(process.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _live_processes_in_group(process.pid) == {}
    code_sandbox.remove_leftovers(process.pid)  # as the worker pool does: the killed process's folders and cgroups

"""Hostile programs against the code reward (issue 38): each one scored 1.0 or escaped its bounds
before the assert harness and the per-sample limits.

Every attack is a *wrong* program (``add`` subtracts) that tries to pass ``add``'s tests anyway,
or a program that tries to hold more than the sample's memory or time. They only touch the
sandbox's own files and processes.
"""

import json
import time

import pytest

from hybridflow.rewards import code_sandbox
from hybridflow.rewards.code import compute_score
from hybridflow.rewards.code_sandbox import run_python

needs_bwrap = pytest.mark.skipif(
    not code_sandbox.sandbox_available(),
    reason=f"no working sandbox here ({code_sandbox.bwrap_problem()}); `make venv` installs bubblewrap",
)
ADD_ASSERTS = json.dumps({"asserts": ["assert add(2, 3) == 5", "assert add(10, -4) == 6", "assert add(0, 7) == 7"]})
WRONG_ADD = "def add(a, b):\n    return a - b\n"


@pytest.fixture(autouse=True)
def weak_mode_where_bwrap_cannot_run(monkeypatch):
    if not code_sandbox.sandbox_available():
        monkeypatch.setenv(code_sandbox.ALLOW_UNSANDBOXED_ENV, "1")


def score(program: str, truth: str = ADD_ASSERTS) -> float:
    return compute_score(f"```python\n{program}```", truth, time_limit_s=5.0)["score"]


def test_right_and_wrong_programs_are_graded_by_the_harness():
    assert score("def add(a, b):\n    return a + b\n") == 1.0
    assert score(WRONG_ADD) == 0.0
    # right on add(2, 3) (2 + 3) and add(0, 7) (7), wrong on add(10, -4) (10 - -4 = 14): 2 of 3
    assert score("def add(a, b):\n    return a - b if b < 0 else a + b if a else 7\n") == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    "exit_line",
    ["exit()", "quit()", "import sys\nsys.exit(0)", "import os\nos._exit(0)", "raise SystemExit",
     "raise SystemExit(0)", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"],
)  # fmt: skip
def test_exiting_early_never_passes(exit_line):
    assert score(WRONG_ADD + exit_line + "\n") == 0.0


def test_a_right_program_that_ends_with_sys_exit_is_graded_on_its_functions():
    assert score("import sys\ndef add(a, b):\n    return a + b\nsys.exit(0)\n") == 1.0


# The tests are at the end of main.py (old layout), in argv, in a file nearby, or in the harness's memory.
LOOKUP_FROM_FILES = r"""
import os, re, glob
def _texts():
    paths = ['main.py', '/proc/self/cmdline', '/proc/self/environ'] + glob.glob('/sandbox/*') + glob.glob('/tmp/*')
    for pid in os.listdir('/proc'):
        if pid.isdigit():
            paths += [f'/proc/{pid}/cmdline', f'/proc/{pid}/environ'] + glob.glob(f'/proc/{pid}/fd/*')
    for path in paths:
        try:
            with open(path, 'rb') as handle:
                yield handle.read(1 << 20).decode('utf-8', 'replace')
        except OSError:
            pass
TABLE = {}
for text in _texts():
    for a, b, c in re.findall(r'add\((-?\d+),\s*(-?\d+)\)\s*==\s*(-?\d+)', text):
        TABLE[(int(a), int(b))] = int(c)
def add(a, b):
    return TABLE.get((a, b), a - b)
"""

LOOKUP_FROM_PARENT_MEMORY = r"""
import os, re
TABLE = {}
for pid in [os.getppid()] + [int(p) for p in os.listdir('/proc') if p.isdigit()]:
    try:
        maps = open(f'/proc/{pid}/maps').read().splitlines()
        mem = open(f'/proc/{pid}/mem', 'rb')
    except OSError:
        continue
    for line in maps:
        start, end = (int(x, 16) for x in line.split()[0].split('-'))
        if 'rw' not in line.split()[1] or end - start > 64 << 20:
            continue
        try:
            mem.seek(start); chunk = mem.read(end - start).decode('latin-1')
        except (OSError, ValueError, OverflowError):
            continue
        for a, b, c in re.findall(r'add\((-?\d+),\s*(-?\d+)\)\s*==\s*(-?\d+)', chunk):
            TABLE[(int(a), int(b))] = int(c)
def add(a, b):
    return TABLE.get((a, b), a - b)
"""

LOOKUP_FROM_CALLER_FRAME = r"""
import re, sys
def add(a, b):
    frame = sys._getframe(1)
    try:
        line = open(frame.f_code.co_filename).read().splitlines()[frame.f_lineno - 1]
        return int(re.search(r'==\s*(-?\d+)', line).group(1))
    except Exception:
        pass
    numbers = [const for const in frame.f_code.co_consts if type(const) is int and const not in (a, b)]
    return numbers[-1] if numbers else a - b
"""

ALWAYS_EQUAL = r"""
class Anything(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
def add(a, b):
    return Anything(a - b)
"""

FORGED_RECORD = r"""
import os, sys
def add(a, b):
    return a - b
for fd in range(3, 64):
    for index in range(3):
        try:
            os.write(fd, f'pass {index} 1\nok {index} 1\n{index} 1\n'.encode())
        except OSError:
            pass
print('ok\nok\nok')
os._exit(0)
"""


@needs_bwrap
@pytest.mark.parametrize(
    "attack", [LOOKUP_FROM_FILES, LOOKUP_FROM_PARENT_MEMORY, LOOKUP_FROM_CALLER_FRAME, ALWAYS_EQUAL, FORGED_RECORD],
    ids=["files", "parent-memory", "caller-frame", "always-equal", "forged-record"],
)  # fmt: skip
def test_the_program_cannot_see_or_fake_the_tests(attack):
    assert score(attack) == 0.0


def test_stdio_tests_fail_on_a_crash_or_an_early_exit():
    truth = json.dumps({"inputs": ["2 3\n"], "outputs": ["5\n"]})
    assert score("a, b = map(int, input().split())\nprint(a + b)\n", truth) == 1.0
    assert score("import os\nos._exit(0)\nprint(5)\n", truth) == 0.0
    assert score("print(5)\nraise ValueError('crash after the answer')\n", truth) == 0.0


def test_assert_rows_that_are_not_asserts_are_refused_in_one_line():
    from hybridflow.errors import DataError

    with pytest.raises(DataError, match="must be assert statements"):
        compute_score("def f(): pass", json.dumps({"asserts": ["print('hello')"]}))


# --------------------------------------------------------------------------- per-sample limits
FORK_AND_ALLOCATE = r"""
import os, time
children = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        block = bytearray(300 * 2**20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(30)
        os._exit(0)
    children.append(pid)
time.sleep(3)
print('all four hold their memory')
"""


@needs_bwrap
def test_memory_is_bounded_for_the_whole_sample_not_per_process():
    # 4 x 300 MiB children each fit a 512 MiB per-process limit; the sample's 512 MiB does not hold them
    run = run_python(FORK_AND_ALLOCATE, memory_mb=512, timeout_s=10.0)
    assert run.memory_exceeded and not run.ok and "all four" not in run.stdout


@needs_bwrap
@pytest.mark.parametrize(
    "program",
    ["for k in range(8):\n    open(f'/dev/shm/f{k}', 'wb').write(b'x' * (8 << 20))",  # 8 MiB files: under RLIMIT_FSIZE
     "for k in range(8):\n    open(f'/dev/f{k}', 'wb').write(b'x' * (8 << 20))",
     "import os\nfd = os.memfd_create('big')\nos.write(fd, b'x' * (8 << 20))",
     "import ctypes\nassert ctypes.CDLL(None).shmget(0, 1 << 30, 0o1600) >= 0"],
    ids=["dev-shm", "dev", "memfd", "sysv-shm"],
)  # fmt: skip
def test_memory_outside_any_process_is_refused(program):
    run = run_python(program + "\nprint('held')\n", timeout_s=10.0)
    assert not run.ok and "held" not in run.stdout


def test_sleeping_forever_is_killed_at_the_time_limit():
    start = time.monotonic()
    run = run_python("import time\ntime.sleep(10**6)\n", timeout_s=1.0)
    assert run.timed_out and time.monotonic() - start < 1.0 + 3.0


@needs_bwrap
def test_a_looping_assert_program_costs_one_time_limit():
    start = time.monotonic()
    truth = json.dumps({"asserts": ["assert add(1, 1) == 2"] * 5})
    result = compute_score("def add(a, b):\n    while True: pass\n", truth, time_limit_s=1.0)
    assert result["score"] == 0.0 and time.monotonic() - start < 1.0 + 4.0


def test_a_sample_stops_at_the_hard_ceiling_even_without_a_reward_time_out(monkeypatch):
    from hybridflow.rewards import code

    monkeypatch.setattr(code, "SAMPLE_CEILING_S", 1.5)
    code._warn_ceiling.cache_clear()
    truth = json.dumps({"inputs": ["\n"] * 6, "outputs": ["done\n"] * 6})
    start = time.monotonic()
    with pytest.warns(RuntimeWarning, match="1.5 s ceiling per sample"):
        result = compute_score("import time\ntime.sleep(0.6)\nprint('done')\n", truth, time_limit_s=5.0)
    assert result["score"] < 0.5 and time.monotonic() - start < 1.5 + 3.0  # six tests x 0.6 s would run 3.6 s


@needs_bwrap
def test_a_killed_scoring_worker_leaves_no_sandbox_dir(monkeypatch):
    import functools
    import shutil
    import tempfile
    from pathlib import Path

    from hybridflow.rewards.worker_pool import ScoringPool

    tmp_path = Path(tempfile.mkdtemp(prefix="hybridflow-hostile-"))
    tmp_path.chmod(0o755)  # user nobody starts bwrap from here
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    program = "import time\ntime.sleep(10**6)\n"
    pool = ScoringPool(num_workers=1, timeout_s=2.0, preload=())
    try:
        fn = functools.partial(compute_score, time_limit_s=60.0)
        [sample] = pool.map(fn, [((program, json.dumps({"inputs": [""], "outputs": [""]})), {})])
        assert sample.timed_out
        assert [p.name for p in tmp_path.iterdir()] == []
    finally:
        pool.close()
        shutil.rmtree(tmp_path)


@pytest.mark.parametrize("test, sent, value", [
    ("assert add(2, 3) == 5", [("add", [2, 3])], True),
    ("assert abs(area(2) - 12.566) < 1e-3", [("area", [2])], True),
    ("import math\nassert math.isclose(area(2), 12.566, rel_tol=1e-3)", [("area", [2])], True),
    ("assert not is_prime(8) and sorted(primes(10)) == [2, 3, 5, 7]", [("is_prime", [8]), ("primes", [10])], True),
    ("assert all(add(a, b) == a + b for a, b in [(1, 2), (3, 4)])", [("add", [1, 2]), ("add", [3, 4])], True),
    ("assert sorted(primes(10), key=lambda p: -p) == [7, 5, 3, 2]", [("primes", [10])], True),
    ("assert add(2, 3) == 6", [("add", [2, 3])], False),
])  # fmt: skip
def test_the_program_is_asked_only_to_call_its_functions_on_plain_arguments(test, sent, value):
    """The real judge over real pipes; the peer thread stands where the sandbox's server would be
    and records every request: the expected values (5, 12.566, [2, 3, 5, 7]) never reach it."""
    import os
    import threading

    from hybridflow.rewards import sandbox_harness as wire
    from hybridflow.rewards import sandbox_judge

    functions = {"add": lambda a, b: a + b, "area": lambda r: 12.5664, "is_prime": lambda n: False,
                 "primes": lambda n: [7, 5, 3, 2]}  # fmt: skip
    requests_read, requests_write = os.pipe()
    replies_read, replies_write = os.pipe()
    calls = []

    def program():
        with os.fdopen(requests_read) as requests, os.fdopen(replies_write, "w") as replies:
            replies.write('{"ready": 1}\n')
            replies.flush()
            for line in requests:
                request = json.loads(line)
                if "names" in request:
                    reply = {"names": {name: {"fn": 1} for name in request["names"] if name in functions}}
                else:
                    calls.append((request["call"], wire.decode(request["args"])))
                    reply = {"v": wire.encode(functions[request["call"]](*wire.decode(request["args"])))}
                replies.write(json.dumps(reply) + "\n")
                replies.flush()

    peer = threading.Thread(target=program)
    peer.start()
    channel = sandbox_judge.ProgramChannel(requests_write, replies_read)
    entries = sandbox_judge.parse_assert_tests([test])
    try:
        assert sandbox_judge.judge(channel, "", entries, 5.0, time.monotonic() + 30) == [value]
    finally:
        os.close(requests_write)
        peer.join()
        os.close(replies_read)
    assert calls == sent

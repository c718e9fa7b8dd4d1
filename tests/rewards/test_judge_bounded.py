"""The judge cannot be stalled, starved or killed; a sample's memory is the kernel's bound (issue 61).

Each attack is a wrong (or too greedy) program that, before issue 61, kept the judge busy past the
sample's clock (a quadratic decode), ended the reward process (a trusted ``SystemExit``), held more
than ``memory_mb`` (the memory check skipped while bytes trickled in; kernel memory in SysV objects),
or made an honest program score 0 (``select`` on a descriptor above 1,023). Each must score 0 and
leave this process (the reward process) alive, the sample ending within its bound.
"""

import json
import resource
import time

import pytest

from hybridflow.rewards import code_sandbox, sandbox_cgroup, sandbox_limits
from hybridflow.rewards.code import compute_score
from hybridflow.rewards.code_sandbox import run_asserts, run_python

pytestmark = pytest.mark.skipif(
    not code_sandbox.sandbox_available(),
    reason=f"no working sandbox here ({code_sandbox.bwrap_problem()}); `make sandbox` installs bubblewrap",
)
needs_cgroup = pytest.mark.skipif(not sandbox_cgroup.available(), reason="no writable memory cgroup here")
RIGHT = "def add(a, b):\n    return a + b\n"


def score(program: str, asserts: list[str], time_limit_s: float = 5.0) -> float:
    truth = json.dumps({"asserts": asserts})
    return compute_score(f"```python\n{program}```", truth, time_limit_s=time_limit_s)["score"]


# ------------------------------------------------------------------ unbounded work in the judge
# 70k integers sharing one hash (hash(k * (2**61 - 1) + 1) == 1): ~2.5 MB on the wire, quadratic to put
# in a set or dict (31-54 s before, with the program's clock stopped). The program builds them as a list
# (linear) for a test that makes the set, or writes the set's wire form straight onto the reply pipe.
COLLIDING_LIST = "def f():\n    return [k * (2**61 - 1) + 1 for k in range(70000)]\n"
COLLIDING_WIRE = r"""
import json, os, sys, time
def f():
    items = [{"i": format(k * (2**61 - 1) + 1, "x")} for k in range(70000)]
    body = {TAG: items} if TAG == "s" else {TAG: [[item, None] for item in items]}
    os.write(int(sys.argv[-1]), (json.dumps({"v": body}) + "\n").encode())
    time.sleep(60)
"""


@pytest.mark.parametrize(
    "program, test",
    [(COLLIDING_WIRE.replace("TAG", '"s"'), "assert f() == {1}"),
     (COLLIDING_WIRE.replace("TAG", '"d"'), "assert f() == {1: None}"),
     (COLLIDING_LIST, "assert set(f()) == {1}"),
     (COLLIDING_LIST, "from collections import Counter\nassert Counter(f()) == Counter([1])")],
    ids=["set-on-the-wire", "dict-on-the-wire", "list-made-a-set-by-the-test", "list-counted-by-the-test"],
)  # fmt: skip
def test_a_quadratic_answer_costs_the_judge_one_time_limit(program, test):
    start = time.monotonic()
    assert run_asserts(program, [test], timeout_s=1.0) == [False]
    assert time.monotonic() - start < 2 * 1.0 + 6.0  # the sample's bound (module body + 1 entry) + slack


def test_a_trusted_function_fed_a_huge_argument_is_cut_at_the_entry_clock():
    program = "from math import factorial\ndef n():\n    return 10**8\n"  # factorial(10**8): minutes
    start = time.monotonic()
    assert run_asserts(program, ["assert factorial(n()) > 0", "assert n() == 10**8"], timeout_s=1.0) == [
        False, False]  # the judge stopped with the first entry: the rest fail too  # fmt: skip
    assert time.monotonic() - start < 3 * 1.0 + 6.0


# ------------------------------------------------------------------ no trusted call ends or stalls the judge
@pytest.mark.parametrize(
    "program, test",
    [("from json.tool import main\n", "assert main() == 6"),  # parsed the host's argv, raised SystemExit
     ("from json.tool import main\n", "assert [main()] == [6]"),
     ("from argparse import ArgumentParser as main\n", "assert main().parse_args() == 6"),
     ("from unittest import main\n", "assert main() == 6"),
     ("from itertools import count as add\n", "assert list(add()) == [1]"),  # infinite in the judge
     ("from itertools import repeat\n", "assert list(repeat(1)) == [1]"),
     ("from pdb import set_trace\n", "assert set_trace() == 1")],
    ids=["json.tool", "json.tool-in-a-list", "argparse", "unittest", "count-aliased", "repeat", "pdb"],
)  # fmt: skip
def test_a_standard_function_named_by_the_program_runs_in_the_sandbox(program, test):
    start = time.monotonic()
    assert score(program, [test], time_limit_s=1.0) == 0.0  # and this process is still here
    assert time.monotonic() - start < 2 * 1.0 + 6.0


def test_the_allow_list_is_by_function_not_by_module():
    from hybridflow.rewards.sandbox_judge import stdlib_imports

    trusted = stdlib_imports("from json.tool import main\nfrom json import loads\nfrom math import pi, gcd\n"
                             "from itertools import count\nfrom collections import Counter\n")  # fmt: skip
    assert trusted == {"loads": ("json", "loads"), "pi": ("math", "pi"), "gcd": ("math", "gcd"),
                       "Counter": ("collections", "Counter")}  # fmt: skip


def test_honest_programs_that_import_their_helpers_keep_their_reward():
    program = "from math import gcd\nfrom collections import Counter\ndef add(a, b):\n    return a + b\n"
    tests = ["assert gcd(add(6, 6), 18) == 6", "assert Counter('abca') == Counter(a=2, b=1, c=1)"]
    assert score(program, tests) == 1.0


# ------------------------------------------------------------------ descriptors above select's 1,023
def test_an_honest_program_scores_with_more_than_1023_files_open_here():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} is below 1,200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [open("/dev/null") for _ in range(1100)]
    try:
        assert score(RIGHT, ["assert add(2, 3) == 5"]) == 1.0
        assert code_sandbox.run_python("print(7)").stdout == "7\n"
    finally:
        for handle in held:
            handle.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# ------------------------------------------------------------------ memory: the kernel's bound
# three children hold 500 MiB each (under the 1 GiB per process) while a thread trickles a space every
# 2 ms onto the reply pipe: the judge that looked at memory only when nothing arrived never looked. The
# program answers only once its children have touched 1,200 MiB, so on a busy machine too the answers
# come after the bound is passed (before, a 2 s sleep: children still allocating under load 10 answered first)
TRICKLE_AND_HOLD = r"""
import os, sys, threading, time
replies = int(sys.argv[-1])
def trickle():
    while True:
        os.write(replies, b' ')
        time.sleep(0.002)
threading.Thread(target=trickle, daemon=True).start()
touched_read, touched_write = os.pipe()
for _ in range(3):
    if os.fork() == 0:
        block = bytearray(500 * 2**20)
        for i in range(0, len(block), 4096):
            block[i] = 1
            if i % (50 * 2**20) == 0:
                os.write(touched_write, b'.')  # one byte per 50 MiB touched
        time.sleep(30)
        os._exit(0)
touched = 0
while touched < 24:  # 1,200 MiB touched: past the bound however slowly the children got there
    touched += len(os.read(touched_read, 64))
def add(a, b):
    return a + b
"""


@pytest.fixture(params=["cgroup", "polled"])
def memory_bound(request, monkeypatch):
    """The kernel's bound (a memory cgroup) where there is one, and the polled fallback."""
    if request.param == "cgroup" and not sandbox_cgroup.available():
        pytest.skip("no writable memory cgroup here")
    if request.param == "polled":
        monkeypatch.setenv(sandbox_cgroup.CGROUP_ENV, "0")
    sandbox_cgroup._base.cache_clear()
    yield request.param
    sandbox_cgroup._base.cache_clear()


def test_memory_is_bounded_while_bytes_keep_arriving(memory_bound):
    tests = ["assert add(2, 3) == 5", "assert add(1, 1) == 2"]
    assert run_asserts(TRICKLE_AND_HOLD, tests, timeout_s=10.0, memory_mb=1024) == [False, False]


SEMAPHORES = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
made = 0
for _ in range(4000):  # 4,000 sets of 8,000 semaphores: ~1 GB of kernel memory, no process's RSS
    if libc.semget(0, 8000, 0o1600) < 0:
        break
    made += 1
print('held', made * 8000 * 64)  # struct sem: 64 bytes
"""
MESSAGES = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
message = ctypes.create_string_buffer(8192 + 8)
message[0] = b'\x01'
made = 0
for _ in range(30000):  # 30,000 queues x 16 KiB of messages: ~500 MB of kernel memory
    queue = libc.msgget(0, 0o1600)
    if queue < 0 or libc.msgsnd(queue, message, 8192, 0) < 0 or libc.msgsnd(queue, message, 8192, 0) < 0:
        break
    made += 1
print('held', made * 2 * 8192)
"""


@pytest.mark.parametrize("program", [SEMAPHORES, MESSAGES], ids=["semaphores", "message-queues"])
def test_sysv_ipc_is_refused(program):
    run = run_python(program, memory_mb=256, timeout_s=10.0)
    assert run.stdout == "held 0\n", run


@needs_cgroup
@pytest.mark.parametrize("program", [SEMAPHORES, MESSAGES], ids=["semaphores", "message-queues"])
def test_kernel_memory_is_charged_to_the_sample(program, monkeypatch):
    # without the seccomp refusal, the cgroup still bounds what the kernel holds for the sample: its
    # allocations fail at memory_mb, or the sample is stopped there (the polled fallback saw none of it: ~500 MB
    # of message queues held, semaphore sets held for the whole time limit)
    monkeypatch.setattr(sandbox_limits, "_BLOCKED_NAMES", ("memfd_create",))
    run = run_python(program, memory_mb=256, timeout_s=10.0)
    # bounded, and said so: the kernel refused the sample memory at memory_mb (its allocations failed there, or it
    # was killed there), which the sample's verdict reports whatever the program managed to print after (once
    # the queues fill the cgroup, even the pipe buffer of its output can be refused: an empty stdout and rc 120)
    assert run.memory_exceeded and not run.timed_out and not run.ok, run

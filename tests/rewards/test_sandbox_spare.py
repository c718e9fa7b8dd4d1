"""Sandboxes prepared one sample ahead (issue 61): the cgroup join off the sample's clock, nothing shared.

A sample's sandbox is started while the sample before it runs: its own fresh cgroup joined and its tmpfs
mounted, then waiting for the harness's arguments on a pipe (``sandbox_spare``). These tests check that it
has joined before its sample exists, that each sample still gets its own cgroup, folders and tmpfs, that a
spare prepared under other settings is not used, and that no spare outlives its reward process.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from hybridflow.rewards import code_sandbox, sandbox_cgroup, sandbox_leftovers, sandbox_spare
from hybridflow.rewards.code_sandbox import run_asserts, run_python

pytestmark = pytest.mark.skipif(
    not (code_sandbox.sandbox_available() and code_sandbox.inode_caps_work()),
    reason="sandboxes are prepared ahead only where bwrap and the inode-capped tmpfs work here",
)
KEY = code_sandbox._spare_key


def _spare(kind: str = "program", memory_mb: int = 1024) -> sandbox_spare.Spare:
    return sandbox_spare._SPARES[KEY(kind, memory_mb)]


def _waiting(spare: sandbox_spare.Spare, within_s: float = 20.0) -> bool:
    """Whether the spare's script reached its wait: its tmpfs mounted (after the cgroup join) and asleep on its pipe."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{spare.process.pid}/wchan") as handle:
                asleep = "pipe" in handle.read()
            with open(f"/proc/{spare.process.pid}/mountinfo") as handle:
                mounted = sum(spare.host_dir in line for line in handle) == 3
        except OSError:
            return False
        if asleep and mounted:
            return True
        time.sleep(0.02)
    return False


@pytest.fixture(autouse=True)
def no_spares():
    sandbox_spare.discard_all()
    yield
    sandbox_spare.discard_all()


def test_the_next_sandbox_joins_its_own_cgroup_and_mounts_before_its_sample():
    assert run_python("print(1)").stdout == "1\n"
    spare = _spare()
    assert spare.process.poll() is None and _waiting(spare)
    if sandbox_cgroup.available():  # joined already: the grace period the join waits is not the next sample's
        with open(spare.memory.cgroup.procs) as handle:
            assert str(spare.process.pid) in handle.read().split()
    with open(os.path.join(spare.host_dir, "program", "main.py")) as handle:
        assert handle.read() == ""  # no sample's code exists yet
    assert run_python("print(2)").stdout == "2\n"
    assert spare.process.poll() is not None  # it ran that sample, and a new one waits for the next
    assert _spare().process.pid != spare.process.pid


def test_each_sample_has_its_own_folders_and_cgroup():
    write = "open('/tmp/left', 'w').write('x'); open('/sandbox/left', 'w').write('x'); print('ok')"
    look = "import os; print(sorted(os.listdir('/tmp')), sorted(os.listdir('/sandbox')))"
    assert run_python(write).stdout == "ok\n"
    groups = [_spare().memory.cgroup]
    assert run_python(look).stdout == "[] ['main.py']\n"
    groups.append(_spare().memory.cgroup)
    if sandbox_cgroup.available():
        assert groups[0].path != groups[1].path
    tests = ["assert add(2, 3) == 5"]
    assert run_asserts("open('/tmp/left', 'w').write('x')\ndef add(a, b):\n    return a + b\n", tests) == [True]
    assert run_asserts("import os\ndef add(a, b):\n    return a + b + len(os.listdir('/tmp'))\n", tests) == [True]


def test_a_spare_of_other_settings_is_not_used(monkeypatch):
    assert run_python("print(1)", memory_mb=256).stdout == "1\n"
    small = _spare(memory_mb=256)
    assert run_python("print(1)", memory_mb=512).stdout == "1\n"
    assert small.process.poll() is None  # still waiting for a 256 MiB sample
    if sandbox_cgroup.available():
        with open(os.path.join(_spare(memory_mb=512).memory.cgroup.path, "memory.limit_in_bytes")) as handle:
            assert int(handle.read()) == 512 * 2**20
    monkeypatch.setattr(code_sandbox.sandbox_limits, "_BLOCKED_NAMES", ("memfd_create",))  # another seccomp filter
    assert KEY("program", 256) not in sandbox_spare._SPARES
    assert run_python("print(3)", memory_mb=256).stdout == "3\n"
    assert small.process.poll() is None  # not used under the other filter


def test_a_fork_does_not_use_its_parent_s_spare():
    assert run_python("print(1)").stdout == "1\n"
    spare = _spare()
    pid = os.fork()
    if pid == 0:
        taken = sandbox_spare.take(KEY("program", 1024), lambda: None)
        os._exit(0 if taken is None else 1)
    assert os.waitpid(pid, 0)[1] == 0
    assert _spare() is spare and spare.process.poll() is None
    assert run_python("print(2)").stdout == "2\n"


def test_finish_discards_the_spares():
    assert run_python("print(1)").stdout == "1\n"
    assert run_asserts("def f():\n    return 1\n", ["assert f() == 1"]) == [True]
    spares = list(sandbox_spare._SPARES.values())
    assert len(spares) == 2
    sandbox_leftovers.finish()
    assert sandbox_spare._SPARES == {}
    for spare in spares:
        assert spare.process.returncode is not None and not os.path.exists(spare.host_dir)
        if spare.memory.cgroup is not None:
            sandbox_cgroup._sweep(wait=True)
            assert not os.path.exists(spare.memory.cgroup.path)


KILLED_AFTER_A_SAMPLE = """
import os, sys
from hybridflow.rewards import sandbox_spare
from hybridflow.rewards.code_sandbox import run_python, _spare_key
run_python("print(1)")
print(sandbox_spare._SPARES[_spare_key("program", 1024)].process.pid, flush=True)
os.kill(os.getpid(), 9)
"""


def test_a_killed_reward_process_leaves_no_waiting_sandbox():
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    reward = subprocess.Popen([sys.executable, "-c", KILLED_AFTER_A_SAMPLE], env=env, stdout=subprocess.PIPE, text=True)
    spare = int(reward.communicate()[0])
    try:
        assert reward.returncode == -signal.SIGKILL
        deadline = time.monotonic() + 20
        while _alive(spare) and time.monotonic() < deadline:
            time.sleep(0.05)  # its pipe closed with the reward process: the script reads no line and ends
        assert not _alive(spare)
    finally:
        if _alive(spare):
            os.kill(spare, signal.SIGKILL)
        code_sandbox.remove_leftovers(reward.pid)  # what the worker pool does for a killed worker: folders, cgroups


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

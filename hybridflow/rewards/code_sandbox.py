"""Run an untrusted Python program in a subprocess sandbox, and grade it on test cases.

The sandbox is a fresh interpreter (``python -I``: no user site, no ``PYTHON*`` env)
in an empty temporary directory that is deleted afterwards, with

- a wall-clock limit: the whole process group is killed when it runs over;
- ``RLIMIT_AS`` (address space) so a huge allocation fails with ``MemoryError``
  instead of swapping the machine, plus ``RLIMIT_CPU``, ``RLIMIT_FSIZE`` (16 MiB of
  file writes) and no core dumps;
- no network, best effort: a new network namespace (``unshare -rn``) where the
  kernel allows unprivileged user namespaces, and in every case ``socket`` made to
  raise inside the interpreter. It is a guard against accidents and reward hacking
  by ordinary code, not a security boundary against hostile native code.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

_FILE_SIZE_LIMIT = 16 * 2**20
_OUTPUT_LIMIT_CHARS = 1 << 20

# Runs inside the sandboxed interpreter: limits first, then the user's program.
_BOOTSTRAP = r"""
import resource, runpy, socket, sys
memory_bytes, cpu_seconds, file_bytes, path = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
def _no_network(*args, **kwargs):
    raise OSError("network access is disabled in the sandbox")
socket.socket = socket.create_connection = socket.socketpair = _no_network
sys.argv = [path]
runpy.run_path(path, run_name="__main__")
"""


@dataclass(frozen=True)
class ExecutionResult:
    """Outcome of one sandboxed run; ``returncode`` is None when it timed out."""

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


@functools.cache
def _network_isolation_prefix() -> tuple[str, ...]:
    """``('unshare', '-rn')`` where a user + network namespace can be made, else ()."""
    if shutil.which("unshare") is None:
        return ()
    try:
        probe = subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return ("unshare", "-rn") if probe.returncode == 0 else ()


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_python(
    *, program: str, stdin: str = "", time_limit_s: float = 5.0, memory_limit_mb: int = 1024
) -> ExecutionResult:
    """Run ``program`` with ``stdin`` under the limits in the module docstring."""
    with tempfile.TemporaryDirectory(prefix="hybridflow-sandbox-") as workdir:
        path = os.path.join(workdir, "main.py")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(program)
        command = [
            *_network_isolation_prefix(), sys.executable, "-I", "-c", _BOOTSTRAP,
            str(memory_limit_mb * 2**20), str(int(time_limit_s) + 1), str(_FILE_SIZE_LIMIT), path,
        ]  # fmt: skip
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1"}
        process = subprocess.Popen(
            command, cwd=workdir, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True,
        )  # fmt: skip
        try:
            stdout, stderr = process.communicate(stdin, timeout=time_limit_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            _kill_group(process)
            stdout, stderr = process.communicate()
            timed_out = True
        finally:
            _kill_group(process)  # reap any children it left behind
    return ExecutionResult(
        returncode=None if timed_out else process.returncode,
        stdout=stdout[:_OUTPUT_LIMIT_CHARS],
        stderr=stderr[-_OUTPUT_LIMIT_CHARS:],
        timed_out=timed_out,
    )


def outputs_match(actual: str, expected: str) -> bool:
    """Judge-style comparison: trailing whitespace of each line and trailing blank lines ignored."""

    def canonical(text: str) -> list[str]:
        return [line.rstrip() for line in text.strip().splitlines()]

    return canonical(actual) == canonical(expected)

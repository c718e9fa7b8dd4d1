"""Run an untrusted Python program in a sandbox, and grade it on test cases.

``run_python(code, stdin=..., timeout_s=..., memory_mb=...)`` runs ``code`` as ``__main__``;
``run_asserts(code, asserts, ...)`` runs the asserts here, in the trusted judge of
:mod:`hybridflow.rewards.sandbox_judge`, against the program served by
:mod:`hybridflow.rewards.sandbox_harness` (the program's process only calls its own
functions on plain arguments and answers plain data). Both use the base interpreter
(``python -I -S``, standard library only) inside bubblewrap (``bwrap``, the Debian package
``bubblewrap``):

- its own PID, mount, network, IPC, UTS and user namespaces: no network at all, it
  sees only its own processes, and when the time-out kills bwrap the kernel kills the
  whole PID namespace -- children that ``setsid()`` or close their pipes included;
- a root made of read-only system folders (``/usr``, the interpreter's prefix) and
  nothing else: no ``/etc``, ``/home``, ``/root`` or checkout, so no ``/etc/passwd``,
  project files or trainer files to read, write or delete;
- one writable scratch dir, ``/sandbox`` (the working dir, a 64 MiB tmpfs that holds
  ``main.py``), a 64 MiB ``/tmp`` and a 16 MiB ``/dev/shm``, each of at most
  :data:`sandbox_limits.TMPFS_INODES` inodes (mounted by util-linux ``unshare`` + ``mount``
  in a namespace of their own before bwrap binds them in: bwrap's ``--tmpfs`` cannot cap
  inodes); ``/dev`` itself is read-only; all vanish with the sandbox;
- user ``nobody`` (uid 65534) with no capabilities and no nested user namespaces;
- ``RLIMIT_AS`` (``memory_mb``), ``RLIMIT_CPU``, ``RLIMIT_FSIZE`` (16 MiB),
  ``RLIMIT_NPROC`` (32 tasks), ``RLIMIT_NOFILE`` (64) and no core dumps;
- the whole sample's memory bounded across forks, kernel memory included, by a memory cgroup of
  its own (:mod:`sandbox_cgroup`) where one can be made, else by watching the tree's resident
  memory (:mod:`sandbox_limits`); ``memfd_create``, SysV ``shmget``/``semget``/``msgget``, POSIX
  ``mq_open`` and foreign-ABI syscalls are refused by a seccomp filter;
- output read incrementally: the first ``output_limit_bytes`` (1 MiB) of stdout and of
  stderr are kept, the rest is read and dropped (``stdout_truncated`` says so), so a program
  that prints gigabytes costs no memory here.

Where bwrap is missing or the kernel forbids user namespaces, ``run_python`` refuses
with :class:`SandboxUnavailableError` -- unless the weaker mode was allowed
(``reward_model.sandbox_fusion.allow_unsandboxed=true``, which sets
``HYBRIDFLOW_ALLOW_UNSANDBOXED_CODE=1`` for the reward worker processes). The weaker
mode keeps the rlimits, the bounded output and a process-group kill, but the program
runs as the trainer's user with its file access: a guard against accidents, not
against hostile code. One warning line says so.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from hybridflow.errors import ConfigError
from hybridflow.rewards import (judge_process, judge_server, sandbox_cgroup, sandbox_harness, sandbox_judge,
                                sandbox_leftovers, sandbox_limits, sandbox_spare, sandbox_supervisor)

ALLOW_UNSANDBOXED_ENV = "HYBRIDFLOW_ALLOW_UNSANDBOXED_CODE"
TIMEOUT_ENV = "HYBRIDFLOW_SANDBOX_TIMEOUT_S"
MEMORY_ENV = "HYBRIDFLOW_SANDBOX_MEMORY_MB"
OUTPUT_LIMIT_BYTES = 1 << 20
DEFAULT_TIMEOUT_S = 10.0
"""The time limit where ``timeout_s`` is None (``reward_model.sandbox_fusion.timeout_s: null``)."""
_FILE_SIZE_LIMIT = 16 * 2**20
_SCRATCH_BYTES = 64 * 2**20
_MAX_PROCESSES = 32  # threads count too; with RLIMIT_AS the hard memory bound between watchdog polls
_MAX_OPEN_FILES = 64
_NOBODY = "65534"

_HARNESS_SOURCE = Path(sandbox_harness.__file__).read_text(encoding="utf-8")


class SandboxUnavailableError(ConfigError):
    """No working bubblewrap here, and the weaker mode was not allowed."""


@dataclass(frozen=True)
class ExecutionResult:
    """Outcome of one sandboxed run; ``returncode`` is None when it timed out.

    ``stdout`` / ``stderr`` hold at most the first ``output_limit_bytes`` (1 MiB) each; ``truncated``
    says more was printed on either and dropped, ``stdout_truncated`` on stdout.
    """

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool = False
    memory_exceeded: bool = False  # the tree passed (in a cgroup: reached) memory_mb: killed, or refused memory
    stdout_truncated: bool = False  # stdout alone was longer than the limit: judging it would judge a part

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.memory_exceeded


def _reachable_by_others(path: str) -> bool:
    """Every folder above ``path`` is searchable and ``path`` executable by any user."""
    parts = os.path.realpath(path).split(os.sep)
    folders = [os.sep + os.path.join(*parts[1:i]) if i > 1 else os.sep for i in range(1, len(parts))]
    try:
        return all(os.stat(f).st_mode & 0o001 for f in folders) and bool(os.stat(path).st_mode & 0o001)
    except OSError:
        return False


@functools.cache
def _interpreter() -> tuple[str, str | None]:
    """(interpreter, prefix to bind or None): the sandbox gets a standard library, not the venv.

    The trainer's base interpreter when user nobody can reach it, else the system's
    ``python3`` (a pyenv interpreter under ``/root`` is not reachable by nobody).
    """
    base = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    for candidate in (base, "/usr/local/bin/python3", "/usr/bin/python3"):
        if os.path.isfile(candidate) and _reachable_by_others(candidate):
            candidate = os.path.realpath(candidate)
            prefix = os.path.realpath(sys.base_prefix) if candidate == base else None
            return candidate, None if prefix is None or prefix.startswith("/usr/") else prefix
    return base, os.path.realpath(sys.base_prefix)


def _drop_to_nobody() -> dict:
    """Popen arguments that start bwrap as nobody when we are root and nobody can reach the interpreter.

    As root, the sandbox's uid maps to root outside, and the kernel exempts root from
    ``RLIMIT_NPROC``; starting bwrap as nobody makes the program nobody on the host too.
    """
    executable, _ = _interpreter()
    if os.geteuid() != 0 or not _reachable_by_others(executable):
        return {}
    return {"user": int(_NOBODY), "group": int(_NOBODY), "extra_groups": []}


@functools.cache
def _setpriv() -> str | None:
    return shutil.which("setpriv")


def _as_nobody() -> tuple[list[str], dict]:
    """(argv prefix, Popen arguments) that start bwrap as nobody where :func:`_drop_to_nobody` says to.

    util-linux ``setpriv`` (real, effective and saved uid and gid nobody, no supplementary groups) first in
    the argv, so that Popen changes no user and can ``vfork``: a Popen that changes user forks the reward
    process, copying its page tables (14 ms of CPU for a torch-sized one) per sandbox. Popen's own user
    change where setpriv is missing.
    """
    drop = _drop_to_nobody()
    if not drop or _setpriv() is None:
        return [], drop
    return [_setpriv(), "--reuid", _NOBODY, "--regid", _NOBODY, "--clear-groups", "--"], {}


_TMPFS = (("sandbox", "/sandbox", _SCRATCH_BYTES), ("tmp", "/tmp", _SCRATCH_BYTES),
          ("shm", "/dev/shm", sandbox_limits.SHM_BYTES))  # fmt: skip
"""(folder of the host dir, path in the sandbox, size): the writable tmpfs, each capped in inodes too."""


def _host_dirs(host_dir: str, code: str) -> str:
    """Write ``host_dir/program/main.py`` and make the empty mount points of the tmpfs folders; returns main.py."""
    os.chmod(host_dir, 0o755)  # user nobody mounts and binds from here when we are root
    for folder, _, _ in _TMPFS:
        os.mkdir(os.path.join(host_dir, folder), 0o755)
    mounts = [(os.path.join(host_dir, folder), size) for folder, _, size in _TMPFS]
    _write_readable(host_dir, "fstab", sandbox_limits.tmpfs_fstab(mounts))
    program = os.path.join(host_dir, "program")
    os.mkdir(program)
    return _write_readable(program, "main.py", code)


def _bwrap_command(host_dir: str, harness_args: list[str], seccomp_fd: int | None, capped: bool,
                   join_cgroup: str | None = None, wait_stdin: str | None = None) -> list[str]:  # fmt: skip
    """The sandbox's argv: :func:`sandbox_limits.tmpfs_mount_prefix` joins ``join_cgroup`` and mounts the capped
    tmpfs, and bwrap binds them (``capped``), or bwrap's own tmpfs, of the same sizes but no inode cap.
    ``wait_stdin``: prepared ahead, the mount script waits for the harness's arguments (not in ``harness_args``)."""
    executable, prefix = _interpreter()
    fstab = os.path.join(host_dir, "fstab")
    mount_prefix = sandbox_limits.tmpfs_mount_prefix(fstab, join_cgroup, wait_stdin) if capped else []
    command = [
        *mount_prefix, "bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
        "--uid", _NOBODY, "--gid", _NOBODY, "--cap-drop", "ALL", "--hostname", "sandbox",
        "--ro-bind", "/usr", "/usr",
    ]  # fmt: skip
    for link in ("bin", "lib", "lib64", "sbin"):
        if os.path.islink(f"/{link}"):
            command += ["--symlink", os.readlink(f"/{link}"), f"/{link}"]
        elif os.path.isdir(f"/{link}"):
            command += ["--ro-bind", f"/{link}", f"/{link}"]
    if prefix is not None:
        command += ["--ro-bind", prefix, prefix]
    if seccomp_fd is not None:
        command += ["--seccomp", str(seccomp_fd)]
    command += ["--proc", "/proc", "--dev", "/dev"]
    for folder, path, size in _TMPFS:
        own_tmpfs = ["--size", str(size), "--tmpfs", path]
        command += ["--bind", os.path.join(host_dir, folder), path] if capped else own_tmpfs
    command += [
        "--remount-ro", "/dev", "--ro-bind", os.path.join(host_dir, "program", "main.py"), "/sandbox/main.py",
        "--remount-ro", "/", "--chdir", "/sandbox",
        "--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", "/sandbox",
        "--setenv", "LANG", "C.UTF-8", "--setenv", "OMP_NUM_THREADS", "1",
        executable, "-I", "-S", "-c", _HARNESS_SOURCE, *harness_args,
    ]  # fmt: skip
    return command


def _probe(capped: bool) -> str | None:
    """None where the sandbox (with the capped tmpfs or bwrap's own) runs ``pass``; else why not."""
    with tempfile.TemporaryDirectory(prefix="hybridflow-sandbox-probe-") as folder:
        _host_dirs(folder, "pass\n")
        command = _bwrap_command(folder, _harness_args(1024, 5.0, "bwrap", "program"), None, capped=capped)
        prefix, drop = _as_nobody()
        try:
            done = subprocess.run(prefix + command, capture_output=True, timeout=30, stdin=subprocess.DEVNULL, **drop)
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"bwrap failed to start: {error}"
    if done.returncode != 0:
        return f"bwrap cannot create its namespaces here: {done.stderr.decode(errors='replace').strip()[:200]}"
    return None


@functools.cache
def inode_caps_work() -> bool:
    """Whether util-linux ``unshare`` + ``mount`` can mount the inode-capped tmpfs folders here."""
    tools = shutil.which("bwrap") and shutil.which("unshare") and shutil.which("mount")
    return bool(tools) and _probe(capped=True) is None


@functools.cache
def bwrap_problem() -> str | None:
    """None where bubblewrap runs here; else why not (missing, or namespaces refused). Where only
    the inode caps cannot be mounted (no util-linux, or a policy that lets bwrap alone make user
    namespaces), the sandbox runs with bwrap's uncapped tmpfs and one warning says so."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    if inode_caps_work():
        return None
    problem = _probe(capped=False)
    if problem is None:
        warnings.warn(
            "code sandbox: cannot mount inode-capped tmpfs folders here (util-linux unshare/mount missing or "
            "refused a user namespace); the sandbox's writable folders have no inode cap, so a program can hold "
            "kernel memory in empty files",
            RuntimeWarning,
            stacklevel=2,
        )
    return problem


def sandbox_available() -> bool:
    """Whether :func:`run_python` runs fully isolated on this machine."""
    return bwrap_problem() is None


def apply_sandbox_settings(*, allow_unsandboxed: bool, timeout_s: float | None, memory_mb: int) -> None:
    """Make ``reward_model.sandbox_fusion.*`` the defaults of this process and the scorer processes it starts.

    Environment variables, because scorers run in spawned worker processes that do not
    share this module's state.
    """
    os.environ[ALLOW_UNSANDBOXED_ENV] = "1" if allow_unsandboxed else "0"
    os.environ[TIMEOUT_ENV] = str(_time_limit(timeout_s))
    os.environ[MEMORY_ENV] = str(int(memory_mb))


def default_limits() -> tuple[float, int]:
    """(timeout_s, memory_mb) set by :func:`apply_sandbox_settings` (a null time-out there is
    :data:`DEFAULT_TIMEOUT_S`), else (5 s, 1024 MiB)."""
    return float(os.environ.get(TIMEOUT_ENV, 5.0)), int(os.environ.get(MEMORY_ENV, 1024))


def unsandboxed_allowed() -> bool:
    return os.environ.get(ALLOW_UNSANDBOXED_ENV, "") not in ("", "0", "false", "False")


@functools.cache
def _warn_weak_mode(problem: str) -> None:
    warnings.warn(
        f"code sandbox: {problem}; running untrusted code WITHOUT isolation (rlimits only) because "
        "reward_model.sandbox_fusion.allow_unsandboxed=true",
        RuntimeWarning,
        stacklevel=3,
    )


def check_sandbox() -> None:
    """Raise :class:`SandboxUnavailableError` unless code can run (isolated, or weak mode allowed)."""
    problem = bwrap_problem()
    if problem is None:
        return
    if unsandboxed_allowed():
        _warn_weak_mode(problem)
        return
    raise SandboxUnavailableError(
        f"cannot run untrusted code: {problem}. Install it (`apt-get install bubblewrap`) on a kernel that "
        "allows user namespaces, or set reward_model.sandbox_fusion.allow_unsandboxed=true to run code with "
        "resource limits only (NOT isolated from your files)"
    )


def _write_readable(folder: str, name: str, text: str) -> str:
    """Write ``folder/name`` readable by user nobody (who starts bwrap when we are root)."""
    os.chmod(folder, 0o755)
    path = os.path.join(folder, name)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(path, 0o644)
    return path


def _harness_args(memory_mb: int, timeout_s: float, mode: str, kind: str) -> list[str]:
    """The limits and mode that :func:`sandbox_harness.main` reads from its argv."""
    limits = (memory_mb * 2**20, int(timeout_s) + 1, _FILE_SIZE_LIMIT, _MAX_PROCESSES, _MAX_OPEN_FILES)
    return [*(str(value) for value in limits), mode, kind]


def _memory_bound(memory_mb: int, isolated: bool) -> sandbox_cgroup.MemoryBound:
    """The sample's memory bound; its cgroup is joined by user nobody where the sandbox starts as nobody."""
    return sandbox_cgroup.MemoryBound(memory_mb, int(_NOBODY) if isolated and _drop_to_nobody() else None)


def _pass_file(folder: str, name: str, data: bytes) -> int:
    """An open descriptor of a file that is already unlinked: only the holder of the fd can read it."""
    path = os.path.join(folder, name)
    with open(path, "wb") as handle:
        handle.write(data)
    fd = os.open(path, os.O_RDONLY)
    os.unlink(path)
    return fd


@dataclass
class _Launch:
    """What one sandboxed run is given: the program, stdin, limits and the harness's mode."""

    code: str
    stdin: str
    timeout_s: float
    memory_mb: int
    kind: str = "program"  # or "serve": the program server of the assert tests
    passed_fds: tuple[int, ...] = ()  # the server's two pipe ends, given to the harness in its argv
    output_limit: int = OUTPUT_LIMIT_BYTES  # bytes kept of stdout and of stderr


def _start(launch: _Launch, host_dir: str, stdin_file, output, memory: sandbox_cgroup.MemoryBound,
           wait_stdin: str | None = None) -> subprocess.Popen:  # fmt: skip
    """Start the sandbox in ``memory``'s cgroup; ``output`` is where its stdout and stderr go (PIPE or DEVNULL).
    ``wait_stdin``: prepared ahead (:func:`_prepare`), it waits for its harness's arguments on ``stdin_file``."""
    program_path = _host_dirs(host_dir, launch.code)
    isolated = sandbox_available()
    args = _harness_args(launch.memory_mb, launch.timeout_s, "bwrap" if isolated else "weak", launch.kind)
    args += [str(fd) for fd in launch.passed_fds]
    seccomp = sandbox_limits.seccomp_filter() if isolated else None
    seccomp_fd = None if seccomp is None else _pass_file(host_dir, "seccomp.bpf", seccomp)
    passed = [*launch.passed_fds, *([] if seccomp_fd is None else [seccomp_fd])]
    weak_command = [sys.executable, "-I", "-S", "-c", _HARNESS_SOURCE, *args]
    if isolated and inode_caps_work():  # the mount script joins the cgroup: no shell of its own
        command = _bwrap_command(host_dir, [] if wait_stdin else args, seccomp_fd, True, memory.procs, wait_stdin)
    else:
        command = memory.prefix() + (_bwrap_command(host_dir, args, seccomp_fd, False) if isolated else weak_command)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1"}
    prefix, drop = _as_nobody() if isolated else ([], {})
    try:
        process = subprocess.Popen(
            prefix + command, cwd=os.path.dirname(program_path), env=env, stdin=stdin_file, stdout=output,
            stderr=output, start_new_session=True, pass_fds=passed, **drop,
        )  # fmt: skip
        memory.root_pid = process.pid
        return process
    finally:
        for fd in passed:
            os.close(fd)  # the sandbox holds them now


def _time_limit(timeout_s: float | None) -> float:
    return DEFAULT_TIMEOUT_S if timeout_s is None else float(timeout_s)


def _ahead() -> bool:
    """Whether sandboxes are prepared one sample ahead (:mod:`sandbox_spare`): where the mount script starts them."""
    return sandbox_available() and inode_caps_work()


def _spare_key(kind: str, memory_mb: int) -> tuple:
    """Every setting a prepared sandbox was started with: one prepared under other settings is not used."""
    return kind, memory_mb, sandbox_cgroup.available(), sandbox_limits.seccomp_filter(), tempfile.gettempdir()


def _prepare(kind: str, memory_mb: int) -> sandbox_spare.Spare:
    """A sandbox of ``kind`` started ahead: its fresh cgroup joined and tmpfs mounted, then waiting for its sample."""
    memory = _memory_bound(memory_mb, True)
    host_dir = sandbox_leftovers.new()
    go_read, go_write = -1, -1
    channel = passed = None
    try:
        stdin = _write_readable(host_dir, "stdin.txt", "") if kind == "program" else os.devnull
        go_read, go_write = os.pipe()
        if kind == "serve":
            (requests_read, requests_write), (replies_read, replies_write) = os.pipe(), os.pipe()
            channel, passed = (requests_write, replies_read), (requests_read, replies_write)
        launch = _Launch(code="", stdin="", timeout_s=0.0, memory_mb=memory_mb, kind=kind, passed_fds=passed or ())
        output = subprocess.PIPE if kind == "program" else subprocess.DEVNULL
        process = _start(launch, host_dir, go_read, output, memory, wait_stdin=stdin)  # closes passed
    except BaseException:
        for fd in (go_write, *(channel or ())):
            if fd >= 0:
                os.close(fd)
        memory.close()
        sandbox_leftovers.release(host_dir)
        raise
    finally:
        if go_read >= 0:
            os.close(go_read)
    return sandbox_spare.Spare(host_dir, memory, process, go_write, channel, passed)


def _go(spare: sandbox_spare.Spare, launch: _Launch) -> subprocess.Popen:
    """Give a prepared sandbox its sample: its program (and stdin) written, then the harness's arguments sent."""
    _write_readable(os.path.join(spare.host_dir, "program"), "main.py", launch.code)
    if launch.kind == "program":
        _write_readable(spare.host_dir, "stdin.txt", launch.stdin)
    args = _harness_args(launch.memory_mb, launch.timeout_s, "bwrap", launch.kind)
    return spare.start(args + [str(fd) for fd in spare.passed or ()])


def _run_ahead(launch: _Launch) -> ExecutionResult:
    """:func:`_run` in a sandbox prepared ahead; the next sample's is prepared while this one runs."""
    key, prepare = _spare_key("program", launch.memory_mb), functools.partial(_prepare, "program", launch.memory_mb)
    spare = sandbox_spare.take(key, prepare)
    try:
        process = _go(spare, launch)
    except BaseException:
        spare.discard()
        raise
    started = time.monotonic()
    try:
        streams = {"stdout": process.stdout.fileno(), "stderr": process.stderr.fileno()}
        reader = sandbox_supervisor.CappedReader(streams, launch.output_limit)
        try:
            sandbox_spare.refill(key, prepare)
            stopped = sandbox_supervisor.supervise(process, reader, launch.timeout_s, spare.memory, started)
        finally:
            sandbox_supervisor.kill_tree(process)
            process.stdout.close()
            process.stderr.close()
    finally:
        spare.memory.close()
        sandbox_leftovers.release(spare.host_dir)
    return _result(process, reader, stopped)


def _run(launch: _Launch) -> ExecutionResult:
    """Run one program with stdin; its capped output and why it stopped."""
    check_sandbox()
    sandbox_leftovers.reap()
    if _ahead():
        return _run_ahead(launch)
    memory = _memory_bound(launch.memory_mb, sandbox_available())
    with sandbox_leftovers.host_folder() as host_dir:
        stdin_path = _write_readable(host_dir, "stdin.txt", launch.stdin)
        try:
            with open(stdin_path, "rb") as stdin_file:
                process = _start(launch, host_dir, stdin_file, subprocess.PIPE, memory)
                streams = {"stdout": process.stdout.fileno(), "stderr": process.stderr.fileno()}
                reader = sandbox_supervisor.CappedReader(streams, launch.output_limit)
                try:
                    stopped = sandbox_supervisor.supervise(process, reader, launch.timeout_s, memory)
                finally:
                    sandbox_supervisor.kill_tree(process)
                    process.stdout.close()
                    process.stderr.close()
        finally:
            memory.close()
    return _result(process, reader, stopped)


def _result(process: subprocess.Popen, reader: sandbox_supervisor.CappedReader, stopped: str | None) -> ExecutionResult:
    return ExecutionResult(
        returncode=None if stopped == "time" else process.returncode,
        stdout=reader.text("stdout"),
        stderr=reader.text("stderr"),
        timed_out=stopped == "time",
        truncated=bool(reader.truncated),
        memory_exceeded=stopped == "memory",
        stdout_truncated="stdout" in reader.truncated,
    )


def run_python(
    code: str, *, stdin: str = "", timeout_s: float | None = 5.0, memory_mb: int = 1024,
    output_limit_bytes: int = OUTPUT_LIMIT_BYTES,
) -> ExecutionResult:  # fmt: skip
    """Run ``code`` with ``stdin`` in the sandbox described in the module docstring.

    ``timeout_s=None`` is :data:`DEFAULT_TIMEOUT_S`; stdout and stderr keep their first
    ``output_limit_bytes`` each (``stdout_truncated`` / ``truncated`` say more was dropped).

    Raises:
        SandboxUnavailableError: bwrap does not work here and the weak mode is not allowed.
    """
    launch = _Launch(code=code, stdin=stdin, timeout_s=_time_limit(timeout_s), memory_mb=memory_mb,
                     output_limit=output_limit_bytes)  # fmt: skip
    return _run(launch)


def run_asserts(code: str, asserts: list[str], *, timeout_s: float | None = 5.0, memory_mb: int = 1024) -> list[bool]:
    """Whether ``code`` passes each entry of ``asserts``, judged by :mod:`sandbox_judge` in a judge
    process (:mod:`judge_process`), killed with the sandbox at the sample's clock (and reused for a
    later sample only after judging this one whole within its bounds).

    The sandbox runs only the program's own functions on the arguments sent to it
    (:mod:`sandbox_harness`). ``timeout_s`` (None: :data:`DEFAULT_TIMEOUT_S`) bounds each entry,
    the program's time and the judge's decoding and comparing together, and the module body's; all
    of them together stop at ``timeout_s * (len(asserts) + 1)``.
    """
    entries = sandbox_judge.parse_assert_tests(asserts)  # a bad row fails here, in one line
    timeout_s = _time_limit(timeout_s)
    check_sandbox()
    try:
        return _judged(code, entries, timeout_s, memory_mb, served=True)
    except judge_server.ServerFailed:  # counted and said; that judge is killed: judge afresh, forked here
        return _judged(code, entries, timeout_s, memory_mb, served=False)


def _judged(code: str, entries: list, timeout_s: float, memory_mb: int, served: bool) -> list[bool]:
    """One sandbox of :func:`run_asserts` (prepared ahead where it can be), its judge one of the judge server's
    (``served``) or forked here."""
    launch = _Launch(code=code, stdin="", timeout_s=timeout_s * (len(entries) + 1), memory_mb=memory_mb,
                     kind="serve")  # fmt: skip
    sandbox_leftovers.reap()
    key, prepare = _spare_key("serve", memory_mb), functools.partial(_prepare, "serve", memory_mb)
    spare = sandbox_spare.take(key, prepare) if _ahead() else None
    if spare is not None:
        memory, host_dir, channel = spare.memory, spare.host_dir, spare.channel
        spare.channel = None  # judge_process.run closes them
    else:
        (requests_read, requests_write), (replies_read, replies_write) = os.pipe(), os.pipe()
        launch.passed_fds = (requests_read, replies_write)
        memory, host_dir = _memory_bound(memory_mb, sandbox_available()), sandbox_leftovers.new()
        channel = (requests_write, replies_read)
    started: list[subprocess.Popen] = []

    def start_sandbox() -> None:  # once the judge has the sample
        if spare is None:
            started.append(_start(launch, host_dir, subprocess.DEVNULL, subprocess.DEVNULL, memory))
            return
        started.append(_go(spare, launch))
        sandbox_spare.refill(key, prepare)  # the next sample's, while this one runs

    try:
        bounds = judge_process.Bounds(timeout_s, launch.timeout_s, memory_mb, memory.poll_interval_s)
        return judge_process.run(code, entries, channel, bounds, memory, start_sandbox, served)
    finally:
        if spare is not None and not started:
            spare.discard()  # never given its sample
        else:
            for process in started:
                sandbox_supervisor.kill_tree(process)
                sandbox_leftovers.reap_later(process)  # it dies (its namespaces torn down) while the next sample runs
            memory.close()
            sandbox_leftovers.release(host_dir)


def remove_leftovers(pid: int) -> None:
    """Remove the temp dirs of sandboxes that process ``pid`` started (it was killed mid-run)."""
    for folder in Path(tempfile.gettempdir()).glob(f"{sandbox_leftovers.PREFIX}{pid}-*"):
        shutil.rmtree(folder, ignore_errors=True)
    sandbox_cgroup.remove_leftovers(pid)


def outputs_match(actual: str, expected: str) -> bool:
    """Judge-style comparison: trailing whitespace of each line and trailing blank lines ignored."""

    def canonical(text: str) -> list[str]:
        return [line.rstrip() for line in text.strip().splitlines()]

    return canonical(actual) == canonical(expected)

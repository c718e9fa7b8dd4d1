"""A memory cgroup per sample: the kernel bounds a sample's memory, kernel memory included .

Where this process may make child cgroups (a writable cgroup v1 ``memory`` hierarchy, or a cgroup
v2 folder delegated to us with the ``memory`` controller on), each sandbox joins a cgroup of its
own before it runs anything, with ``memory.limit_in_bytes`` (v1) / ``memory.max`` (v2) set to the
sample's ``memory_mb`` and no swap. The kernel charges to it every page its processes touch and
the kernel memory they make (SysV semaphores and message queues, pipes, inodes, page tables, the
tmpfs files they write), and OOM-kills inside it at the bound: no poll, no window. A sample that
saw an OOM kill fails as a whole (:meth:`SampleCgroup.oom_killed`).

Where no such folder exists, :func:`available` is False and the sandbox falls back to polling its
tree's resident memory (``sandbox_limits.tree_rss_bytes``) with ``RLIMIT_AS`` per process.
``HYBRIDFLOW_SANDBOX_CGROUP=0`` forces that fallback (tests use it).
"""

from __future__ import annotations

import atexit
import functools
import itertools
import os
import signal
import time

from hybridflow.rewards import sandbox_limits

CGROUP_ENV = "HYBRIDFLOW_SANDBOX_CGROUP"
PREFIX = "hybridflow-sandbox-"
_COUNTER = itertools.count()
_REMOVE_TRIES = 100  # x 10 ms: a killed PID namespace takes a moment to empty its cgroup


def _own_path(controller: str) -> str | None:
    """This process's cgroup path in the v1 hierarchy of ``controller`` ("" for v2), or None."""
    try:
        with open("/proc/self/cgroup") as handle:
            for line in handle:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controllers.split(",") == ([controller] if controller else [""]):
                    return path
    except OSError:
        pass
    return None


def _mount_point(fstype: str, option: str | None) -> str | None:
    try:
        with open("/proc/self/mounts") as handle:
            for line in handle:
                _, point, kind, options = line.split()[:4]
                if kind == fstype and (option is None or option in options.split(",")):
                    return point
    except OSError:
        pass
    return None


def _candidates() -> list[tuple[str, str]]:
    """(folder, "v1" | "v2") where a sample cgroup may go, this process's own cgroup first."""
    found = []
    for version, fstype, option, controller in (("v1", "cgroup", "memory", "memory"), ("v2", "cgroup2", None, "")):
        mount, own = _mount_point(fstype, option), _own_path(controller)
        if mount is None:
            continue
        nested = os.path.join(mount, (own or "/").lstrip("/"))
        found += [(folder, version) for folder in dict.fromkeys([nested, mount]) if os.path.isdir(folder)]
    return found


@functools.cache
def _base() -> tuple[str, str] | None:
    """The first candidate where a probe cgroup can be made and limited, else None."""
    if os.environ.get(CGROUP_ENV, "1") in ("0", "false", "False"):
        return None
    for folder, version in _candidates():
        if version == "v2":
            try:
                with open(os.path.join(folder, "cgroup.subtree_control")) as handle:
                    if "memory" not in handle.read().split():
                        continue
            except OSError:
                continue
        probe = SampleCgroup.make(folder, version, 64 << 20)
        if probe is not None:
            probe.remove()
            return folder, version
    return None


def available() -> bool:
    """Whether samples run in a memory cgroup of their own here (the kernel's bound)."""
    return _base() is not None


def _write(path: str, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


class SampleCgroup:
    """One sample's memory cgroup: made, joined by the sandbox's first process, removed after."""

    def __init__(self, path: str, version: str, memory_bytes: int | None = None):
        self.path, self.version, self.memory_bytes = path, version, memory_bytes
        self._fds: list[int] = []

    @classmethod
    def make(cls, base: str, version: str, memory_bytes: int) -> "SampleCgroup | None":
        path = os.path.join(base, f"{PREFIX}{os.getpid()}-{next(_COUNTER)}")
        try:
            os.mkdir(path)
        except OSError:
            return None
        group = cls(path, version, memory_bytes)
        limits = (("memory.max", memory_bytes), ("memory.swap.max", 0)) if version == "v2" else (
            ("memory.limit_in_bytes", memory_bytes), ("memory.memsw.limit_in_bytes", memory_bytes))
        try:
            for name, value in limits:
                if name == limits[0][0] or os.path.exists(os.path.join(path, name)):
                    _write(os.path.join(path, name), str(value))
        except OSError:
            group.remove()
            return None
        return group

    @classmethod
    def create(cls, memory_bytes: int, joiner_uid: int | None) -> "SampleCgroup | None":
        """A cgroup limited to ``memory_bytes`` whose ``cgroup.procs`` user ``joiner_uid`` may write, or None."""
        base = _base()
        _sweep()
        group = None if base is None else cls.make(*base, memory_bytes)
        if group is not None and joiner_uid is not None:
            try:
                os.chown(group.procs, joiner_uid, -1)
            except OSError:
                group.remove()
                return None
        return group

    @property
    def procs(self) -> str:
        return os.path.join(self.path, "cgroup.procs")

    def oom_events(self) -> int | None:
        """A descriptor that becomes readable when the sample hits its bound, or None.

        v1: the OOM killer is turned off for this cgroup and an eventfd registered on
        ``memory.oom_control``: at the bound its processes wait (they cannot allocate) until the
        supervisor, woken by the eventfd, kills the whole sample. v2: ``memory.oom.group`` makes the
        kernel's OOM kill take the whole cgroup, so the sandbox ends by itself (None).
        """
        if self.version == "v2":
            try:
                _write(os.path.join(self.path, "memory.oom.group"), "1")
            except OSError:
                pass
            return None
        events = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        control = os.open(os.path.join(self.path, "memory.oom_control"), os.O_RDONLY | os.O_CLOEXEC)
        try:
            _write(os.path.join(self.path, "cgroup.event_control"), f"{events} {control}")
            _write(os.path.join(self.path, "memory.oom_control"), "1")
        except OSError:
            os.close(events)
            return None
        finally:
            os.close(control)
        self._fds.append(events)
        return events

    def join_prefix(self) -> list[str]:
        """The argv to put first: the process joins this cgroup, then execs the rest (so all it starts is in it)."""
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', self.procs]

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of this cgroup for passing its memory bound."""
        name = "memory.events" if self.version == "v2" else "memory.oom_control"
        try:
            with open(os.path.join(self.path, name)) as handle:
                fields = dict(line.split() for line in handle if len(line.split()) == 2)
        except OSError:
            return False
        return int(fields.get("oom_kill", 0)) > 0 or int(fields.get("under_oom", 0)) > 0

    def reached_bound(self) -> bool:
        """Whether the sample's memory reached its bound: the kernel refused it memory there (a refused kernel
        allocation, e.g. a message queue or the pipe buffer of its output, is an error in the program, no OOM kill).
        v1: the peak usage is the limit (``memory.failcnt`` is not kept by every kernel); v2: ``max`` events."""
        try:
            if self.version == "v2":
                with open(os.path.join(self.path, "memory.events")) as handle:
                    fields = dict(line.split() for line in handle if len(line.split()) == 2)
                return int(fields.get("max", 0)) > 0
            with open(os.path.join(self.path, "memory.max_usage_in_bytes")) as handle:
                return self.memory_bytes is not None and int(handle.read()) >= self.memory_bytes
        except (OSError, ValueError):
            return False

    def kill(self) -> None:
        """SIGKILL every process in the cgroup."""
        try:
            with open(self.procs) as handle:
                pids = [int(pid) for pid in handle.read().split()]
        except OSError:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def remove(self) -> None:
        """Kill what is left and remove the cgroup; while its killed processes finish dying (a few ms) it is
        left to the next :func:`_sweep` instead of waited for here."""
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
        if not self._try_rmdir():
            _PENDING.append(self)

    def _try_rmdir(self) -> bool:
        self.kill()
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True


class MemoryBound:
    """A sample's memory bound: its cgroup's (the kernel's, kernel memory included), else the
    polled resident memory of its process tree (:func:`sandbox_limits.tree_rss_bytes`)."""

    def __init__(self, memory_mb: int, joiner_uid: int | None):
        self.memory_bytes = memory_mb * 2**20
        self.cgroup = SampleCgroup.create(self.memory_bytes, joiner_uid)
        self.events_fd = None if self.cgroup is None else self.cgroup.oom_events()
        self.root_pid: int | None = None
        self._exceeded = False

    @property
    def poll_interval_s(self) -> float:
        return 3600.0 if self.cgroup is not None else sandbox_limits.WATCH_INTERVAL_S

    def prefix(self) -> list[str]:
        return [] if self.cgroup is None else self.cgroup.join_prefix()

    @property
    def procs(self) -> str | None:
        return None if self.cgroup is None else self.cgroup.procs

    def exceeded(self) -> bool:
        if not self._exceeded:
            if self.cgroup is not None:
                self._exceeded = self.cgroup.oom_killed()
            elif self.root_pid is not None:
                self._exceeded = sandbox_limits.tree_rss_bytes(self.root_pid) > self.memory_bytes
        return self._exceeded

    def reached(self) -> bool:
        """At the end: :meth:`exceeded`, or the kernel refused the sample memory at its bound (its output maybe cut)."""
        return self.exceeded() or (self.cgroup is not None and self.cgroup.reached_bound())

    def kill(self) -> None:
        if self.cgroup is not None:
            self.cgroup.kill()

    def close(self) -> None:
        if self.cgroup is not None:
            self.cgroup.remove()


_PENDING: list[SampleCgroup] = []


def _sweep(wait: bool = False) -> None:
    """Remove the cgroups left busy by :meth:`SampleCgroup.remove`; ``wait``: retry until they go (at exit)."""
    for _ in range(_REMOVE_TRIES if wait else 1):
        _PENDING[:] = [group for group in _PENDING if not group._try_rmdir()]
        if not _PENDING or not wait:
            return
        time.sleep(0.01)


atexit.register(_sweep, wait=True)


def remove_leftovers(pid: int) -> None:
    """Remove the cgroups of sandboxes that process ``pid`` started (it was killed mid-run)."""
    base = _base()
    if base is None:
        return
    for name in os.listdir(base[0]):
        if name.startswith(f"{PREFIX}{pid}-"):
            SampleCgroup(os.path.join(base[0], name), base[1]).remove()
    _sweep()

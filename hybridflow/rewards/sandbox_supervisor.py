"""The supervisor of one sandboxed run: its output read as it comes (capped), its exit, its clock and memory bound.

Moved out of :mod:`code_sandbox` (issue 61) unchanged but for the names.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time

from hybridflow.rewards import sandbox_cgroup, sandbox_limits

_DRAIN_AFTER_KILL_S = 2.0


def kill_tree(process: subprocess.Popen) -> None:
    """SIGKILL the process group; under bwrap that kills its PID namespace, so everything in it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class CappedReader:
    """Reads the named pipes (stdout, stderr) as they come, keeping the first ``limit`` bytes of each;
    ``truncated`` names those that had more. A descriptor registered with ``data=None`` only wakes it."""

    def __init__(self, streams: dict[str, int], limit: int):
        self.limit = limit
        self.kept = {name: bytearray() for name in streams}
        self.truncated: set[str] = set()
        self.selector = selectors.DefaultSelector()
        for name, fd in streams.items():
            os.set_blocking(fd, False)
            self.selector.register(fd, selectors.EVENT_READ, data=name)

    @property
    def open(self) -> bool:
        return any(key.data is not None for key in self.selector.get_map().values())

    def pump(self, timeout_s: float) -> None:
        """Read whatever is ready within ``timeout_s``; closed pipes are unregistered."""
        for key, _ in self.selector.select(timeout=max(timeout_s, 0.0)):
            if key.data is None:
                continue  # the memory bound's event: the supervisor looks at it
            try:
                chunk = os.read(key.fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                self.selector.unregister(key.fd)
                continue
            buffer = self.kept[key.data]
            room = self.limit - len(buffer)
            buffer += chunk[: max(room, 0)]
            if len(chunk) > room:
                self.truncated.add(key.data)

    def text(self, name: str) -> str:
        return self.kept[name].decode("utf-8", errors="replace")


def supervise(process: subprocess.Popen, reader: CappedReader, timeout_s: float,
              memory: sandbox_cgroup.MemoryBound, started: float | None = None) -> str | None:  # fmt: skip
    """Pump output until the process ends; kill the tree at ``timeout_s`` after ``started`` (default: now) or past
    the memory bound (the kernel's, or the polled tree's resident memory). Returns why it was killed: "time",
    "memory" or None."""
    deadline = (time.monotonic() if started is None else started) + timeout_s
    stopped = None
    exited = _exit_event(process)  # wakes us when it exits (not 20 ms later)
    for fd in (memory.events_fd, exited):
        if fd is not None:
            reader.selector.register(fd, selectors.EVENT_READ, data=None)
    while process.poll() is None or reader.open:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            stopped = "time" if process.poll() is None or reader.open else None
            break
        if exited is not None and process.returncode is not None:  # a child holds the pipes: its exit stays readable
            reader.selector.unregister(exited)
            _close(exited)
            exited = None
        # with the pipes closed and no pidfd, only a look at the process says it ended: look often
        woken = reader.open or exited is not None
        reader.pump(min(remaining, memory.poll_interval_s if woken else sandbox_limits.WATCH_INTERVAL_S))
        if memory.exceeded():
            stopped = "memory"
            break
    for fd in (memory.events_fd, exited):
        if fd is not None:
            reader.selector.unregister(fd)
    _close(exited)
    kill_tree(process)  # what is left: the program, or a child that kept the pipes
    memory.kill()
    drain_until = time.monotonic() + _DRAIN_AFTER_KILL_S
    while reader.open and time.monotonic() < drain_until:
        reader.pump(0.05)
    process.wait()
    return "memory" if stopped != "time" and memory.reached() else stopped


def _exit_event(process: subprocess.Popen) -> int | None:
    """A pidfd of ``process`` (readable once it has exited), or None where the kernel has none (Linux < 5.3)."""
    try:
        return os.pidfd_open(process.pid)
    except (AttributeError, OSError):
        return None


def _close(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)

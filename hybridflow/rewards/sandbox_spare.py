"""Sandboxes started one sample ahead: the cgroup join and the tmpfs mounts off the sample's clock.

A sandbox's first process joins the sample's memory cgroup (a write to its ``cgroup.procs``), and the
kernel makes that write wait for an RCU grace period (the cgroup v1 threadgroup lock): 5-17 ms of wall
clock a sandbox on the build machine, median 9 ms, no CPU. With the mount script's start (setpriv,
unshare, sh, mount) that was ~20 % of a sample. So each sandbox is *prepared* while the sample before it
runs: its own fresh cgroup and host folder are made, and its first process is started; it joins the
cgroup, mounts the sample's tmpfs and then waits, before running anything of the sample, for one line on
its stdin (a pipe): the harness's arguments. The sample writes its program (and stdin) into the folder,
sends that line (:meth:`Spare.start`), and the script execs bwrap; the sample's clock starts there.

Nothing is shared between samples: each has its own cgroup, folder, namespaces and tmpfs, all made
before any of its code exists. A prepared sandbox is used by one sample only, of the same kind and
settings (:func:`take` matches its key); it is kept per process (a fork does not use its parent's),
at most one per key and :data:`_MAX_SPARES` in all (the settings used longest ago make room), and discarded at exit (the closed pipe ends its
script, which is also SIGKILLed; its cgroup and folder are removed like a sample's).
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass

from hybridflow.rewards import sandbox_cgroup, sandbox_leftovers

_MAX_SPARES = 4
_SPARES: dict[tuple, "Spare"] = {}
_OWNER = [os.getpid()]
_LOCK = threading.Lock()


@dataclass
class Spare:
    """A sandbox started ahead of its sample, waiting for the harness's arguments on ``go``."""

    host_dir: str
    memory: sandbox_cgroup.MemoryBound
    process: subprocess.Popen
    go: int  # the write end of the script's stdin
    channel: tuple[int, int] | None = None  # a program server's pipes: our ends (requests' write, replies' read)
    passed: tuple[int, int] | None = None  # ... and the numbers of the sandbox's ends (closed here)

    def start(self, harness_args: list[str]) -> subprocess.Popen:
        """Send the harness's arguments: the script execs bwrap. A script that already ended (its mount
        failed, or it was killed) reads nothing; its exit is what the supervisor then sees."""
        try:
            os.write(self.go, (" ".join(harness_args) + "\n").encode())
        except BrokenPipeError:
            pass
        finally:
            os.close(self.go)
            self.go = -1
        return self.process

    def discard(self) -> None:
        """Unused: end its script (the pipe closes; SIGKILL too) and remove its cgroup and folder."""
        for fd in (self.go, *(self.channel or ())):
            if fd >= 0:
                os.close(fd)
        self.go, self.channel = -1, None
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pipe in (self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()
        sandbox_leftovers.reap_later(self.process)
        self.memory.close()
        sandbox_leftovers.release(self.host_dir)


def _forget_parents() -> None:
    """In a fork: forget the parent's spares (closing our copies of its pipes), never use or kill them."""
    if _OWNER[0] != os.getpid():
        for spare in _SPARES.values():
            for fd in (spare.go, *(spare.channel or ())):
                if fd >= 0:
                    os.close(fd)
        _SPARES.clear()
        _OWNER[0] = os.getpid()


def take(key: tuple, prepare: Callable[[], Spare]) -> Spare:
    """The spare prepared for ``key`` (the sample's kind and every setting its start depends on), else a new one."""
    with _LOCK:
        _forget_parents()
        spare = _SPARES.pop(key, None)
    return spare if spare is not None else prepare()


def refill(key: tuple, prepare: Callable[[], Spare]) -> None:
    """Prepare the next sample's sandbox for ``key`` now (while this sample runs), unless one is ready."""
    with _LOCK:
        _forget_parents()
        if key in _SPARES:
            return
    spare = prepare()
    with _LOCK:
        _forget_parents()
        unused = [_SPARES.pop(key)] if key in _SPARES else []
        _SPARES[key] = spare
        while len(_SPARES) > _MAX_SPARES:  # the settings used longest ago make room
            unused.append(_SPARES.pop(next(iter(_SPARES))))
    for spare in unused:
        spare.discard()


def discard_all() -> None:
    """Discard this process's spares (at exit, and before :func:`sandbox_leftovers.finish` cleans up)."""
    with _LOCK:
        _forget_parents()
        spares = list(_SPARES.values())
        _SPARES.clear()
    for spare in spares:
        spare.discard()


atexit.register(discard_all)  # registered after sandbox_cgroup's sweep and leftovers' finish: runs before them
sandbox_leftovers.before_finish(discard_all)

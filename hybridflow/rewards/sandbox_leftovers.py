"""What a finished sample leaves to clean up, done off its critical path: host folders and killed processes.

- *Host folders.* A sandbox's capped tmpfs are mounted on folders of its host folder, in mount
  namespaces of its own. Removing them right after the sandbox exits races the kernel's teardown of
  those namespaces: each ``rmdir`` of a mount point still mounted elsewhere detaches it and waits for
  an RCU grace period (3 to 40 ms a folder measured, 4 such folders a sandbox). A finished sandbox's
  folder goes to a remover thread (:func:`release`), which waits in the kernel while the next sample
  runs.
- *Killed processes.* The sandbox and the judge of an assert sample are SIGKILLed when the judge has
  reported; waiting for them to die (their namespaces torn down, their memory freed) is the kernel's
  work, not the sample's. They are reaped at the next sample's start (:func:`reap`) instead; a killed
  process runs no code of its own again.

At exit both are finished here; ``code_sandbox.remove_leftovers`` removes the folders of a killed
reward process by the pid in their names.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable

PREFIX = "hybridflow-sandbox-"
_PENDING: queue.Queue[str] = queue.Queue()
_REMOVER: list[threading.Thread] = []  # started at the first release, per process (a fork has none)
_KILLED: list[subprocess.Popen | int] = []  # killed, not yet reaped: sandboxes (Popen) and judges (pid)
_BEFORE_FINISH: list[Callable[[], None]] = []  # what hands its leftovers here at exit (the spare sandboxes)


def new() -> str:
    """A fresh host folder of this process's sandboxes (its name carries our pid, for ``remove_leftovers``)."""
    return tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")


@contextlib.contextmanager
def host_folder():
    """A fresh host folder (:func:`new`) for one sandbox, released (:func:`release`) when it ends."""
    folder = new()
    try:
        yield folder
    finally:
        release(folder)


def release(folder: str) -> None:
    """The sandbox of ``folder`` has ended: the remover thread removes it."""
    _PENDING.put(folder)
    if not any(thread.is_alive() for thread in _REMOVER):
        _REMOVER[:] = [threading.Thread(target=_remove_forever, name="sandbox-folder-remover", daemon=True)]
        _REMOVER[0].start()


def _remove_forever() -> None:
    while True:
        _remove_one(_PENDING.get())


def _remove_one(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    _PENDING.task_done()


def reap_later(process: subprocess.Popen | int) -> None:
    """``process`` (a Popen, or the pid of a forked child) was SIGKILLed: reap it at :func:`reap`."""
    _KILLED.append(process)


def _reaped(process: subprocess.Popen | int, block: bool) -> bool:
    if isinstance(process, subprocess.Popen):
        return process.wait() is not None if block else process.poll() is not None
    try:
        return os.waitpid(process, 0 if block else os.WNOHANG)[0] != 0
    except ChildProcessError:
        return True


def reap(block: bool = False) -> None:
    """Reap the killed processes that have died (``block``: wait for all, at exit)."""
    _KILLED[:] = [process for process in _KILLED if not _reaped(process, block)]


def before_finish(discard: Callable[[], None]) -> None:
    """Have :func:`finish` call ``discard`` first (it kills and releases what it holds)."""
    _BEFORE_FINISH.append(discard)


def finish() -> None:
    """At exit: reap every killed process, remove the folders not removed yet here, and wait for the one
    the remover thread may be removing."""
    for discard in _BEFORE_FINISH:
        discard()
    reap(block=True)
    while True:
        try:
            _remove_one(_PENDING.get_nowait())
        except queue.Empty:
            break
    _PENDING.join()


atexit.register(finish)

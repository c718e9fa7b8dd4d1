"""The host folders of sandboxes (``main.py``, the tmpfs mount points), removed off the critical path.

A sandbox's capped tmpfs are mounted on folders of its host folder, in mount namespaces of its own.
Removing those folders right after the sandbox exits races the kernel's teardown of the namespaces:
each ``rmdir`` of a mount point still mounted elsewhere detaches it and waits for an RCU grace period
(3 to 40 ms a folder measured, 4 such folders a sandbox). So a finished sandbox's folder is handed
(:func:`release`) to a remover thread, which waits in the kernel while the next sample runs; what it
has not removed at exit is removed then, and ``code_sandbox.remove_leftovers`` removes those of a
killed process by the pid in their names.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import shutil
import tempfile
import threading

PREFIX = "hybridflow-sandbox-"
_PENDING: queue.SimpleQueue[str] = queue.SimpleQueue()
_REMOVER: list[threading.Thread] = []  # started at the first release, per process (a fork has none)


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
        shutil.rmtree(_PENDING.get(), ignore_errors=True)


def sweep() -> None:
    """Remove the folders not removed yet, here (at exit)."""
    while True:
        try:
            folder = _PENDING.get_nowait()
        except queue.Empty:
            return
        shutil.rmtree(folder, ignore_errors=True)


atexit.register(sweep)

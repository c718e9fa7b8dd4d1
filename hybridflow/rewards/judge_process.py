"""The judge of one sample in a process of its own, bounded and killed by the sample's clock .

:mod:`sandbox_judge` decodes the program's answers and runs the tests' comparisons. That work is
the judge's, but its size is the program's choice: a set of ~70k integers sharing one hash decodes
in quadratic time (54 s for a 2 MB answer), and a trusted call can raise ``SystemExit`` or block.
So it never runs in the long-lived reward process: :func:`run` forks a judge process per sample,
which

- reports one byte per stage on a pipe (``r`` when the module body ran, then ``1``/``0`` per entry);
- runs with ``stdin``/``stdout``/``stderr`` on ``/dev/null`` and ``RLIMIT_AS`` at what it inherited
  plus the sample's ``memory_mb``;
- is SIGKILLed by this process, with the sandbox, when an entry (the program's time *and* the judge's
  decoding and comparing) passes ``entry_s``, or the sample passes ``sample_s``, or the sample passes
  its memory bound (the cgroup's OOM event, or the polled fallback, looked at on a timer of its own,
  whatever arrives on the pipes).

Entries not reported when it stops fail; a judge that dies fails them too, and the reward process
goes on. ``fork`` without ``exec``: the child runs only Python code of the standard library and this
package (no torch). What a fresh judge would do again each sample is done here once: the pure standard
modules a test may use are imported before the first fork (a child's imports die with it), and the
child freezes the objects it inherits out of its garbage collector (a collection would copy their pages).
"""

from __future__ import annotations

import functools
import gc
import importlib
import os
import resource
import select
import signal
import time
from dataclasses import dataclass

from hybridflow.rewards import sandbox_judge, sandbox_leftovers


@dataclass(frozen=True)
class Bounds:
    """The clocks and memory of one sample's judging."""

    entry_s: float  # each entry (and the module body): the program's time and the judge's together
    sample_s: float  # the whole sample
    memory_mb: int  # the judge's memory on top of what it inherits from this process
    poll_s: float  # how often to look at the polled memory bound (a cgroup wakes us itself)


@functools.cache
def _import_pure_modules() -> None:
    """Import here, once, the standard modules a test may use (``sandbox_judge.PURE_MODULES``)."""
    for module in sorted(sandbox_judge.PURE_MODULES):
        try:
            importlib.import_module(module)
        except ImportError:
            pass


def run(program: str, entries: list, channel_fds: tuple[int, int], bounds: Bounds, memory) -> list[bool]:
    """Whether the program passes each entry, judged in a forked judge process.

    ``channel_fds`` (the request pipe's write end, the reply pipe's read end) go to the judge and are
    closed here; ``memory`` is the sandbox's bound (``exceeded()``, ``events_fd``).
    """
    _import_pure_modules()
    results_read, results_write = os.pipe()
    start = time.monotonic()
    try:
        pid = os.fork()
    except BaseException:
        for fd in (results_read, results_write, *channel_fds):
            os.close(fd)
        raise
    if pid == 0:  # the judge: never returns
        _judge_main(program, entries, channel_fds, results_write, bounds, start)
    os.close(results_write)
    for fd in channel_fds:
        os.close(fd)  # the judge holds them: when it dies, the sandbox reads EOF and ends
    try:
        return _collect(results_read, len(entries), bounds, memory, start)
    finally:
        os.kill(pid, signal.SIGKILL)  # our unreaped child: the pid is still its own
        sandbox_leftovers.reap_later(pid)  # it dies while the next sample runs
        os.close(results_read)


def _collect(results_fd: int, count: int, bounds: Bounds, memory, start: float) -> list[bool]:
    """Read the judge's reports until all entries are in, a clock passes, or memory is exceeded."""
    poller = select.poll()
    poller.register(results_fd, select.POLLIN)
    if memory.events_fd is not None:
        poller.register(memory.events_fd, select.POLLIN)
    passed: list[bool] = []
    sample_deadline, entry_deadline = start + bounds.sample_s, start + bounds.entry_s
    while len(passed) < count:
        remaining = min(sample_deadline, entry_deadline) - time.monotonic()
        if remaining <= 0:
            break
        ready = {fd for fd, _ in poller.poll(1000 * min(remaining, bounds.poll_s))}
        if memory.exceeded():
            return [False] * count
        if results_fd in ready:
            chunk = os.read(results_fd, 4096)
            if not chunk:
                break  # the judge ended (crashed, or the program stopped and it said all)
            passed += [byte == ord("1") for byte in chunk if byte != ord("r")]
            entry_deadline = time.monotonic() + bounds.entry_s
    if memory.exceeded():
        return [False] * count
    return (passed + [False] * count)[:count]


def _confine(memory_mb: int) -> None:
    """In the judge: no terminal I/O and no more memory than it inherited plus ``memory_mb``."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    with open("/proc/self/statm") as handle:
        inherited = int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = inherited + memory_mb * 2**20
    limit = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _judge_main(program: str, entries: list, channel_fds: tuple[int, int], results_fd: int, bounds: Bounds,
                start: float) -> None:  # fmt: skip
    """The judge process: judge, report each stage as it ends, exit without running any handler of its parent."""
    status = 1
    try:
        gc.freeze()  # what it inherits is not its garbage: a collection would only copy those pages
        _confine(bounds.memory_mb)
        channel = sandbox_judge.ProgramChannel(*channel_fds)

        def report(mark: bytes) -> None:
            os.write(results_fd, mark)

        sandbox_judge.judge(channel, program, entries, bounds.entry_s, start + bounds.sample_s, report)
        status = 0
    except BaseException:  # noqa: BLE001 - whatever happens here ends only this process
        pass
    finally:
        os._exit(status)

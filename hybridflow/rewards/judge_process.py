"""The judge of one sample in a process of its own, bounded and killed by the sample's clock .

:mod:`sandbox_judge` decodes the program's answers and runs the tests' comparisons. That work is
the judge's, but its size is the program's choice: a set of ~70k integers sharing one hash decodes
in quadratic time (54 s for a 2 MB answer), and a trusted call can raise ``SystemExit`` or block.
So it never runs in the long-lived reward process: :func:`run` starts a fresh judge process per
sample, forked by the judge server (:mod:`judge_server`, a small process, so the fork does not copy
a torch-sized reward process: 14 ms of CPU a fork there) or, without one, by this process; the judge

- reports one byte per stage on a pipe (``r`` when the module body ran, then ``1``/``0`` per entry);
- runs with ``stdin``/``stdout``/``stderr`` on ``/dev/null`` and ``RLIMIT_AS`` at what it inherited
  plus the sample's ``memory_mb``;
- is SIGKILLed by this process, with the sandbox, when an entry (the program's time *and* the judge's
  decoding and comparing) passes ``entry_s``, or the sample passes ``sample_s``, or the sample passes
  its memory bound (the cgroup's OOM event, or the polled fallback, looked at on a timer of its own,
  whatever arrives on the pipes).

Entries not reported when it stops fail; a judge that dies fails them too, and the reward process
goes on. ``fork`` without ``exec``: the child runs only Python code of the standard library and this
package. What a fresh judge would do again each sample is done once in the process that forks it: the
pure standard modules a test may use are imported before the first fork (a child's imports die with
it), and the child freezes the objects it inherits out of its garbage collector (a collection would
copy their pages).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import math
import os
import resource
import select
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from hybridflow.rewards import judge_server, sandbox_judge, sandbox_leftovers


@dataclass(frozen=True)
class Bounds:
    """The clocks and memory of one sample's judging."""

    entry_s: float  # each entry (and the module body): the program's time and the judge's together
    sample_s: float  # the whole sample
    memory_mb: int  # the judge's memory on top of what it inherits from the process that forks it
    poll_s: float  # how often to look at the polled memory bound (a cgroup wakes us itself)


@functools.cache
def import_pure_modules() -> None:
    """Import here, once, the standard modules a test may use (``sandbox_judge.PURE_MODULES``)."""
    for module in sorted(sandbox_judge.PURE_MODULES):
        try:
            importlib.import_module(module)
        except ImportError:
            pass


def run(program: str, entries: list, channel_fds: tuple[int, int], bounds: Bounds, memory,
        start_sandbox: Callable[[], object], served: bool = True) -> list[bool]:  # fmt: skip
    """Whether the program passes each entry, judged in a fresh judge process (forked by the judge
    server, :mod:`judge_server`, where ``served`` and it can run, else here).

    ``start_sandbox()`` starts the program's sandbox while the server forks the judge; a server that fails
    raises :class:`judge_server.ServerFailed` (its judges died with it; the caller judges afresh). ``channel_fds``
    (the request pipe's write end, the reply pipe's read end) go to the judge and are closed here;
    ``memory`` is the sandbox's bound (``exceeded()``, ``reached()``, ``events_fd``).
    """
    import_pure_modules()
    results_read, results_write = os.pipe()
    start = time.monotonic()
    fds = [*channel_fds, results_write]
    try:
        request = judge_server.request_judge(program, entries, fds, bounds, start) if served else None
        try:
            start_sandbox()
        except BaseException:
            with contextlib.suppress(judge_server.ServerFailed):
                _kill_requested(request)
            raise
        kill = _start_judge(request, program, entries, channel_fds, results_write, bounds, start)
    except BaseException:
        os.close(results_read)
        raise
    finally:
        for fd in fds:
            os.close(fd)  # the judge holds them: when it dies, the sandbox reads EOF and ends
    try:
        return _collect(results_read, len(entries), bounds, memory, start)
    finally:
        kill()
        os.close(results_read)


def _kill_requested(request: judge_server.JudgeRequest | None) -> None:
    """The sandbox did not start: SIGKILL the judge the server forked for it."""
    if request is not None:
        _served_killer(request.pidfd())()


def _served_killer(pidfd: int) -> Callable[[], None]:
    def kill_served() -> None:
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except OSError:
            pass  # it has ended and the server reaped it
        finally:
            os.close(pidfd)

    return kill_served


def _start_judge(request: judge_server.JudgeRequest | None, program: str, entries: list,
                 channel_fds: tuple[int, int], results_fd: int, bounds: Bounds,
                 start: float) -> Callable[[], None]:  # fmt: skip
    """The sample's judge, forked by the server (``request``) or, where it has none, here; returns what SIGKILLs it."""
    if request is not None:
        return _served_killer(request.pidfd())
    pid = os.fork()
    if pid == 0:  # the judge: never returns
        judge_main(program, entries, channel_fds, results_fd, bounds, start)

    def kill_forked() -> None:
        os.kill(pid, signal.SIGKILL)  # our unreaped child: the pid is still its own
        sandbox_leftovers.reap_later(pid)  # it dies while the next sample runs

    return kill_forked


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
    if memory.reached():
        return [False] * count
    return (passed + [False] * count)[:count]


def _confine(memory_mb: int, cpu_s: float) -> None:
    """In the judge: no terminal I/O, no more memory than it inherited plus ``memory_mb``, and no more
    than ``cpu_s`` of CPU (a judge whose reward process was killed is not SIGKILLed by it)."""
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
    cpu = math.ceil(cpu_s) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))


def judge_main(program: str, entries: list, channel_fds: tuple[int, int], results_fd: int, bounds: Bounds,
                start: float) -> None:  # fmt: skip
    """The judge process: judge, report each stage as it ends, exit without running any handler of its parent."""
    status = 1
    try:
        gc.freeze()  # what it inherits is not its garbage: a collection would only copy those pages
        _confine(bounds.memory_mb, bounds.sample_s)
        channel = sandbox_judge.ProgramChannel(*channel_fds)

        def report(mark: bytes) -> None:
            os.write(results_fd, mark)

        sandbox_judge.judge(channel, program, entries, bounds.entry_s, start + bounds.sample_s, report)
        status = 0
    except BaseException:  # noqa: BLE001 - whatever happens here ends only this process
        pass
    finally:
        os._exit(status)

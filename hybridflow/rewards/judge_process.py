"""The judge of a sample, in a process of its own, bounded and killed by the sample's clock .

:mod:`sandbox_judge` decodes the program's answers and runs the tests' comparisons. That work is
the judge's, but its size is the program's choice: a set of ~70k integers sharing one hash decodes
in quadratic time (54 s for a 2 MB answer), and a trusted call can raise ``SystemExit`` or block.
So it never runs in the long-lived reward process: :func:`run` gives the sample to a judge process,
a persistent one of the judge server (:mod:`judge_server`: reused for later samples only after a
clean one, killed otherwise) or, without one, a judge this process forks for the sample; the judge

- reports one byte per stage on a pipe (``r`` when the module body ran, then ``1``/``0`` per entry);
- runs with ``stdin``/``stdout``/``stderr`` on ``/dev/null``, ``RLIMIT_AS`` at what it had when forked
  plus the sample's ``memory_mb`` and ``RLIMIT_CPU`` at its CPU so far plus the sample's clock;
- is SIGKILLed by this process, with the sandbox, when an entry (the program's time *and* the judge's
  decoding and comparing) passes ``entry_s``, or the sample passes ``sample_s``, or the sample passes
  its memory bound (the cgroup's OOM event, or the polled fallback, looked at on a timer of its own,
  whatever arrives on the pipes).

Entries not reported when it stops fail; a judge that dies fails them too, and the reward process
goes on. ``fork`` without ``exec``: the judge runs only Python code of the standard library and this
package. The pure standard modules a test may use are imported before the judges are forked, and a
judge freezes the objects it inherits out of its garbage collector (a collection would copy their pages).
"""

from __future__ import annotations

import functools
import gc
import importlib
import math
import os
import pickle
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
    memory_mb: int  # the judge's memory on top of what it had when forked
    poll_s: float  # how often to look at the polled memory bound (a cgroup wakes us itself)


MAX_SAMPLES = 256  # a persistent judge ends after this many samples (what no bound names cannot pile up)
GROWTH_MB = 16  # a judge whose memory grew more than this over a sample ends instead of judging another


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
    """Whether the program passes each entry, judged by a judge process: a persistent judge of the judge
    server (:mod:`judge_server`) where ``served`` and one can run, else one forked here for this sample.

    ``start_sandbox()`` starts the program's sandbox once the judge has the sample; a judge that fails to take
    it raises :class:`judge_server.ServerFailed` (it is killed; the caller judges afresh). ``channel_fds``
    (the request pipe's write end, the reply pipe's read end) go to the judge and are closed here;
    ``memory`` is the sandbox's bound (``exceeded()``, ``reached()``, ``events_fd``). The judge is kept for
    a later sample only when it reported every entry within the bounds; otherwise it is SIGKILLed.
    """
    import_pure_modules()
    results_read, results_write = os.pipe()
    fds = [*channel_fds, results_write]
    judge = None
    try:
        judge = judge_server.acquire() if served else None  # before the sample's clock: it may wait for "ready"
        start = time.monotonic()
        if judge is not None:
            judge.send((program, [entry.source for entry in entries], bounds, start), fds)
        try:
            start_sandbox()
        except BaseException:
            if judge is not None:
                judge.kill()
            raise
        kill = judge.kill if judge is not None else _fork_judge(program, entries, channel_fds, results_write,
                                                                bounds, start)  # fmt: skip
    except BaseException:
        os.close(results_read)
        raise
    finally:
        for fd in fds:
            os.close(fd)  # the judge holds them: when it dies, the sandbox reads EOF and ends
    complete = False
    try:
        passed, complete = _collect(results_read, len(entries), bounds, memory, start)
        return passed
    finally:
        if complete and judge is not None:
            judge_server.release(judge)  # it judged the whole sample within its bounds
        else:
            kill()
        os.close(results_read)


def _fork_judge(program: str, entries: list, channel_fds: tuple[int, int], results_fd: int, bounds: Bounds,
                start: float) -> Callable[[], None]:  # fmt: skip
    """The sample's judge, forked here (no judge server); returns what SIGKILLs it."""
    pid = os.fork()
    if pid == 0:  # the judge: never returns
        judge_main(program, entries, channel_fds, results_fd, bounds, start)

    def kill_forked() -> None:
        os.kill(pid, signal.SIGKILL)  # our unreaped child: the pid is still its own
        sandbox_leftovers.reap_later(pid)  # it dies while the next sample runs

    return kill_forked


def _collect(results_fd: int, count: int, bounds: Bounds, memory, start: float) -> tuple[list[bool], bool]:
    """Read the judge's reports until all entries are in, a clock passes, or memory is exceeded; the verdicts,
    and whether the judge reported every entry (it is done with the sample) before any bound passed."""
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
            return [False] * count, False
        if results_fd in ready:
            chunk = os.read(results_fd, 4096)
            if not chunk:
                break  # the judge ended (crashed, or the program stopped and it said all)
            passed += [byte == ord("1") for byte in chunk if byte != ord("r")]
            entry_deadline = time.monotonic() + bounds.entry_s
    complete = len(passed) >= count
    if memory.reached():
        return [False] * count, complete
    return (passed + [False] * count)[:count], complete


def _quiet() -> None:
    """In a judge: no terminal I/O, no core file."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _pages() -> tuple[int, int]:
    """This process's (address space, resident) bytes."""
    with open("/proc/self/statm") as handle:
        size, resident = handle.read().split()[:2]
    page = os.sysconf("SC_PAGE_SIZE")
    return int(size) * page, int(resident) * page


def _limit(memory_mb: int, cpu_s: float, base_bytes: int, final: bool) -> None:
    """``RLIMIT_AS`` at ``base_bytes + memory_mb`` and ``RLIMIT_CPU`` at this process's CPU so far plus ``cpu_s``
    (SIGXCPU ends it: a judge whose reward process was killed is not SIGKILLed by it). ``final``: the hard CPU
    limit too (a judge of one sample); a persistent judge keeps its hard limit to set the next sample's."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = base_bytes + memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    used = resource.getrusage(resource.RUSAGE_SELF)
    cpu = math.ceil(used.ru_utime + used.ru_stime + cpu_s) + 1
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    cpu = cpu if hard == resource.RLIM_INFINITY else min(cpu, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu if final else hard))


def _judge_sample(program: str, entries: list, channel_fds: tuple[int, int], results_fd: int, bounds: Bounds,
                  start: float) -> None:  # fmt: skip
    """Judge one sample on its descriptors, reporting each stage as it ends."""
    channel = sandbox_judge.ProgramChannel(*channel_fds)

    def report(mark: bytes) -> None:
        os.write(results_fd, mark)

    sandbox_judge.judge(channel, program, entries, bounds.entry_s, start + bounds.sample_s, report)


def judge_main(program: str, entries: list, channel_fds: tuple[int, int], results_fd: int, bounds: Bounds,
                start: float) -> None:  # fmt: skip
    """A judge of one sample (forked by the reward process): judge, exit without running any handler of its parent."""
    status = 1
    try:
        gc.freeze()  # what it inherits is not its garbage: a collection would only copy those pages
        _quiet()
        _limit(bounds.memory_mb, bounds.sample_s, _pages()[0], final=True)
        _judge_sample(program, entries, channel_fds, results_fd, bounds, start)
        status = 0
    except BaseException:  # noqa: BLE001 - whatever happens here ends only this process
        pass
    finally:
        os._exit(status)


def judge_loop(sock) -> None:
    """A persistent judge (forked by the judge server): per request on ``sock``, a sample and its three
    descriptors, judged like :func:`judge_main`'s, then ``r`` (ready) once the sample's descriptors are closed
    and its garbage collected; it ends instead when its memory grew more than :data:`GROWTH_MB` since it was
    forked, after :data:`MAX_SAMPLES` samples, when the reward process closes ``sock``, or on any error."""
    status = 1
    try:
        gc.freeze()
        _quiet()
        base = _pages()
        for _ in range(MAX_SAMPLES):
            try:
                payload, fds = judge_server._receive(sock, 3)
            except (EOFError, ConnectionError):
                break
            program, sources, bounds, start = pickle.loads(payload)
            try:
                _limit(bounds.memory_mb, bounds.sample_s, base[0], final=False)
                entries = sandbox_judge.parse_assert_tests(sources)  # compiled once per row in this judge
                _judge_sample(program, entries, (fds[0], fds[1]), fds[2], bounds, start)
            finally:
                for fd in fds:
                    os.close(fd)
            gc.collect()  # this sample's cycles die now, not in the next sample's time
            if any(now - then > GROWTH_MB * 2**20 for now, then in zip(_pages(), base)):
                break
            sock.sendall(b"r")
        status = 0
    except BaseException:  # noqa: BLE001 - whatever happens here ends only this process
        pass
    finally:
        os._exit(status)

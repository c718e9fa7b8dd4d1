"""Persistent judges and the small server that forks them .

A sample's judge (``judge_process.judge_loop``) decodes the program's answers and runs the tests'
comparisons. Forking a fresh one per sample cost ~8 ms of CPU a sample (the fork, the copy-on-write
faults of a Python process touching its inherited objects, the exit), 20 % of an assert sample's
throughput. So a judge now judges many samples, one at a time, and is thrown away (SIGKILLed) as
soon as one sample was not clean:

- the reward process keeps it only when it reported every entry of the sample within the sample's
  clocks and memory bound (``judge_process.run``); any other end (a clock passed, the memory bound
  passed, the judge died or misbehaved) kills it, and the next sample gets another;
- between two samples it holds nothing of the earlier one: the sample's descriptors are closed, the
  program's answers (fresh plain data) lived only in each entry's namespace, its garbage is
  collected before it says ``r`` (ready), and the program never runs code in it;
- it says ready only while its memory is within :data:`judge_process.GROWTH_MB` of what it had when
  forked, and ends after :data:`judge_process.MAX_SAMPLES` samples; each sample gets its own
  ``RLIMIT_AS`` (what it had when forked + ``memory_mb``) and ``RLIMIT_CPU`` (its CPU so far + the
  sample's clock).

The judges are forked by a *judge server*: a small process (``python -S``, the standard library and
this package) the reward process starts, so a judge is not a fork of a torch-sized reward process.
Per new judge the server forks it with one end of a socket pair and answers the other end and a
pidfd (``SCM_RIGHTS``), with which the reward process SIGKILLs the judge. The server reaps its judges;
it ends, and its judges with it (``PR_SET_PDEATHSIG``), when the reward process's end of its socket
closes. Where it cannot start (no ``pidfd_open``: Linux < 5.3) or fails (killed, stopped past
``_ANSWER_S``), :func:`acquire` returns None and the caller forks the judge itself; a failure is
counted (``FAILURES``) and said in one warning line, and the next sample starts a new server.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import warnings

_HEADER = struct.Struct("!Q")
_PR_SET_PDEATHSIG = 1
_ANSWER_S = 10.0  # a server that does not answer a fork in this long is replaced (it forks, nothing more)
_READY_S = 1.0  # an idle judge that has not said ready in this long (it owes one byte) is killed, not waited for
_IDLE_MAX = 4  # idle judges kept per reward process (one per thread judging at once)
_BOOT = ("import sys; from hybridflow.rewards import judge_process, judge_server; "
         "judge_server.serve(int(sys.argv[1]), judge_process.judge_loop, judge_process.import_pure_modules)")
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(min(size - len(data), 1 << 20))
        if not chunk:
            raise EOFError("the judge server's peer closed the socket")
        data += chunk
    return bytes(data)


def _send(sock: socket.socket, payload: bytes, fds: list[int]) -> None:
    socket.send_fds(sock, [_HEADER.pack(len(payload))], fds)
    sock.sendall(payload)


def _receive(sock: socket.socket, max_fds: int) -> tuple[bytes, list[int]]:
    header, fds, _, _ = socket.recv_fds(sock, _HEADER.size, max_fds)
    if not header:
        raise EOFError("the judge server's peer closed the socket")
    header += _recv_exactly(sock, _HEADER.size - len(header))
    return _recv_exactly(sock, _HEADER.unpack(header)[0]), fds


class _Server:
    """The reward process's handle on its server (one per process: a forked child starts its own)."""

    def __init__(self):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": _PACKAGE_ROOT}
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-S", "-c", _BOOT, str(theirs.fileno())], pass_fds=[theirs.fileno()], env=env,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        finally:
            theirs.close()
        ours.settimeout(_ANSWER_S)
        self.sock, self.pid, self.lock = ours, os.getpid(), threading.Lock()

    @property
    def alive(self) -> bool:
        return self.pid == os.getpid() and self.process.poll() is None and self.sock.fileno() >= 0

    def fork_judge(self) -> tuple[socket.socket, int]:
        """A new judge: our end of its socket and its pidfd. A server that fails the conversation is killed."""
        if not self.lock.acquire(timeout=2 * _ANSWER_S):  # another thread's conversation never ended
            raise OSError("the judge server stayed busy")
        try:
            _send(self.sock, b"judge", [])
            answer, fds = _receive(self.sock, 2)
        except BaseException:
            self.stop()  # the conversation is lost mid-way: the next sample starts a new server
            raise
        finally:
            self.lock.release()
        if answer != b"ok" or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            raise OSError(f"the judge server could not fork a judge: {answer[:200]!r}")
        for fd in fds:
            os.set_inheritable(fd, False)
        return socket.socket(fileno=fds[0]), fds[1]

    def stop(self) -> None:
        """Kill the server (and so its judges: :func:`_die_with`) and reap it."""
        self.sock.close()
        self.process.kill()
        self.process.wait()


_SERVERS: list[_Server] = []
FAILURES = [0]
"""How many times this process's judge server (or a judge of it) failed a request (each time replaced)."""


def _failed(error: BaseException) -> None:
    """Count and say a failure: this sample is judged by a judge the reward process forks, the next one by a new one."""
    FAILURES[0] += 1
    warnings.warn(f"code reward: the judge server failed ({error!r}); this sample is judged by a judge the "
                  f"reward process forks, and the next one by a new judge ({FAILURES[0]} failures so far)",
                  RuntimeWarning, stacklevel=3)  # fmt: skip


def _server() -> _Server:
    """This process's live server, started where there is none (or it died)."""
    server = next((s for s in _SERVERS if s.alive), None)
    if server is None:
        server = _Server()
        _SERVERS[:] = [server]
    return server


class ServerFailed(OSError):
    """A judge failed the request of a sample before that sample started (it is killed): the sample's channel may
    have been read by it, so the caller judges the sample afresh."""


class Judge:
    """The reward process's handle on one persistent judge (forked by the server): its socket and pidfd.

    It judges one sample per request and then says ``r`` (ready: the sample's descriptors closed, its garbage
    collected, its memory back under the judge's bound), or ends instead (retired, :data:`judge_process.MAX_SAMPLES`
    reached). ``owes_ready`` is set while that answer has not been read."""

    def __init__(self, sock: socket.socket, pidfd: int, server: _Server):
        self.sock, self.pidfd, self.server, self.owes_ready = sock, pidfd, server, False

    def ready(self, timeout_s: float) -> bool:
        """Whether it said it is ready within ``timeout_s`` (a new judge is) and has not ended since, nor its server
        (whose end SIGKILLs it, maybe a moment later)."""
        if not self.server.alive:
            return False
        if self.owes_ready:
            poller = select.poll()
            poller.register(self.sock.fileno(), select.POLLIN)
            if not poller.poll(1000 * timeout_s):
                return False
            try:
                self.owes_ready = self.sock.recv(1, socket.MSG_DONTWAIT) != b"r"
            except OSError:
                return False
        ended = select.poll()
        ended.register(self.pidfd, select.POLLIN)  # a pidfd is readable once its process has ended
        return not self.owes_ready and not ended.poll(0)

    def send(self, request: tuple, fds: list[int]) -> None:
        """Give it a sample: ``request`` and the sample's descriptors. Raises :class:`ServerFailed` (it is killed)."""
        self.owes_ready = True
        try:
            _send(self.sock, pickle.dumps(request), fds)
        except OSError as error:
            self.kill()
            _failed(error)
            raise ServerFailed(f"a judge failed its request: {error!r}") from error

    def kill(self) -> None:
        """SIGKILL it (its server reaps it) and drop the handle."""
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)  # it may have ended already: the pidfd says so
        os.close(self.pidfd)
        self.sock.close()


_IDLE: list[Judge] = []
_IDLE_OWNER = [os.getpid()]  # a forked child does not use (nor kill) its parent's judges
_IDLE_LOCK = threading.Lock()


def acquire() -> Judge | None:
    """A judge ready for a sample: an idle one that said it is ready (one that did not within ``_READY_S`` is
    killed), else a new one forked by this process's server. None where no server can run here (no
    ``pidfd_open``: Linux < 5.3) or the server failed (counted and said): the caller forks the judge itself."""
    if not hasattr(os, "pidfd_open"):
        return None
    while (judge := _take_idle()) is not None:
        if judge.ready(_READY_S):
            return judge
        judge.kill()
    try:
        server = _server()
        sock, pidfd = server.fork_judge()
    except (OSError, EOFError) as error:
        _failed(error)
        return None
    return Judge(sock, pidfd, server)


def release(judge: Judge) -> None:
    """``judge`` reported every entry of its sample within the sample's bounds: keep it for a later sample."""
    with _IDLE_LOCK:
        if _IDLE_OWNER[0] == os.getpid() and len(_IDLE) < _IDLE_MAX:
            _IDLE.append(judge)
            return
    judge.kill()


def retire_all() -> None:
    """Kill this process's idle judges: the next sample gets a new one from the server."""
    while (judge := _take_idle()) is not None:
        judge.kill()


atexit.register(retire_all)


def _take_idle() -> Judge | None:
    with _IDLE_LOCK:
        if _IDLE_OWNER[0] != os.getpid():  # a fork of the process that holds them: not ours to use or kill
            for judge in _IDLE:
                judge.sock.close()
                os.close(judge.pidfd)
            _IDLE.clear()
            _IDLE_OWNER[0] = os.getpid()
        return _IDLE.pop() if _IDLE else None


def serve(fd: int, judge_loop, warm) -> None:
    """The server's loop: per request, fork a judge running ``judge_loop`` on one end of a new socket pair and
    answer the other end and the judge's pidfd; reap the judges that ended. ``warm()`` first imports what every
    judge would (the pure standard modules)."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        os._exit(1)  # no pidfd here (Linux < 5.3): before any fork, so the reward process forks its judges
    warm()
    sock = socket.socket(fileno=fd)
    judges: set[int] = set()
    while True:
        try:
            _, fds = _receive(sock, 1)
        except (EOFError, ConnectionError):
            for pid in judges:  # the reward process has gone (killed): so do the judges it cannot kill now
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            os._exit(0)
        for descriptor in fds:
            os.close(descriptor)  # a request carries none
        judges -= _reaped()
        try:
            ours, pidfd = _fork_one(sock, judges, judge_loop)
        except BaseException as error:  # noqa: BLE001 - the request fails, the server goes on
            _send(sock, f"error: {error!r}".encode(), [])
            continue
        _send(sock, b"ok", [ours.fileno(), pidfd])
        ours.close()
        os.close(pidfd)


def _fork_one(sock: socket.socket, judges: set[int], judge_loop) -> tuple[socket.socket, int]:
    """Fork a judge (it never returns) on one end of a socket pair; the other end and a pidfd of it."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    server = os.getpid()
    pid = os.fork()
    if pid == 0:
        sock.close()
        ours.close()
        _die_with(server)
        judge_loop(theirs)
    theirs.close()
    judges.add(pid)
    try:
        return ours, os.pidfd_open(pid)
    except OSError:
        os.kill(pid, signal.SIGKILL)  # a judge the reward process could not kill must not run
        ours.close()
        raise


def _die_with(server: int) -> None:
    """In a judge: SIGKILLed when its server dies (killed by a reward process that lost its answer), so no judge of
    a replaced server judges on beside the one that replaces it."""
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0 or os.getppid() != server:
        os._exit(1)  # no such guard here, or the server died before it was set


def _reaped() -> set[int]:
    """The judges that ended since the last call, reaped."""
    ended = set()
    try:
        while (pid := os.waitpid(-1, os.WNOHANG)[0]) != 0:
            ended.add(pid)
    except ChildProcessError:
        pass
    return ended

"""A fork server for judges: a small process that forks each sample's fresh judge .

Forking the judge from the reward process copies that process's page tables and then its pages on
write, and tears them down at exit: 2.7-3.0 ms of CPU a sample for a 17 MB reward process with the
scorers imported, against 0.8-1.0 ms from a process that imported only ``sandbox_judge`` (and far
more from a trainer process holding torch). So the reward process starts one such server (``python
-S``, the standard library and this package), and per sample sends it the program, the entries'
sources, the bounds and the channel's descriptors (``SCM_RIGHTS``); the server forks a fresh judge
(``judge_process.judge_main``, the same code and bounds as a judge forked here) and answers a
pidfd of it, with which the reward process SIGKILLs it at the sample's clock, as before. The server
reaps its judges; it ends when the reward process's end of the socket closes.

The request is sent before the sample's sandbox starts and its answer read after (:class:`JudgeRequest`),
so the server forks the judge while the reward process starts the sandbox. Where it cannot start (no
``pidfd_open``: Linux < 5.3), :func:`request_judge` returns None and the caller forks the judge itself; a
server that fails a request (killed, stopped past ``_ANSWER_S``) is replaced and asked again once, and
if that fails too the caller forks the judge itself: counted (``FAILURES``) and said in one warning line.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
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
_BOOT = ("import sys; from hybridflow.rewards import judge_process, judge_server; "
         "judge_server.serve(int(sys.argv[1]), judge_process.judge_main, judge_process.import_pure_modules)")
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

    def send(self, request: tuple, fds: list[int]) -> None:
        """Ask for a fork; the lock stays held until :meth:`answer` (one conversation at a time)."""
        if not self.lock.acquire(timeout=2 * _ANSWER_S):  # another thread's conversation never ended
            raise OSError("the judge server stayed busy")
        try:
            _send(self.sock, pickle.dumps(request), fds)
        except BaseException:
            self.stop()  # the conversation is lost mid-way: the next sample starts a new server
            self.lock.release()
            raise

    def answer(self) -> int:
        """The pidfd of the judge asked for by :meth:`send`."""
        try:
            answer, pidfds = _receive(self.sock, 1)
        except BaseException:
            self.stop()
            raise
        finally:
            self.lock.release()
        if answer != b"ok" or len(pidfds) != 1:
            for fd in pidfds:
                os.close(fd)
            raise OSError(f"the judge server could not fork a judge: {answer[:200]!r}")
        return pidfds[0]

    def stop(self) -> None:
        """Kill the server (and so its judges: :func:`_die_with`) and reap it."""
        self.sock.close()
        self.process.kill()
        self.process.wait()


_SERVERS: list[_Server] = []
FAILURES = [0]
"""How many times this process's judge server failed a request (each time replaced; see :func:`_failed`)."""


def _failed(error: BaseException) -> None:
    """Count and say a failed server: the next sample starts a new one, and this one is judged afresh here."""
    FAILURES[0] += 1
    warnings.warn(f"code reward: the judge server failed ({error!r}); this sample is judged again by a judge the "
                  f"reward process forks, and the next one starts a new server ({FAILURES[0]} failures so far)",
                  RuntimeWarning, stacklevel=3)  # fmt: skip


def _server() -> _Server:
    """This process's live server, started where there is none (or it died)."""
    server = next((s for s in _SERVERS if s.alive), None)
    if server is None:
        server = _Server()
        _SERVERS[:] = [server]
    return server


class ServerFailed(OSError):
    """The server failed a request it may have forked a judge for (its judges die with it): the sample's
    channel may have been read by that judge, so the caller judges the sample afresh."""


class JudgeRequest:
    """A judge asked of the server (:func:`request_judge`), forked there while the caller starts the sandbox."""

    def __init__(self, request: tuple, fds: list[int]):
        self.server, self.error = _server(), None
        try:
            self.server.send(request, fds)
        except (OSError, EOFError) as error:
            self.error = error

    def pidfd(self) -> int:
        """The judge's pidfd. Raises :class:`ServerFailed` (counted and said; the server is replaced at the next
        request) where the server failed. Call once."""
        if self.error is None:
            try:
                return self.server.answer()
            except (OSError, EOFError) as error:
                self.error = error
        self.server.stop()  # and its judges with it (_die_with)
        _failed(self.error)
        raise ServerFailed(f"the judge server failed: {self.error!r}") from self.error


def request_judge(program: str, entries: list, fds: list[int], bounds, start: float) -> JudgeRequest | None:
    """Ask the server to fork a fresh judge with ``fds`` (the channel's two ends, then the results pipe's write
    end); its pidfd comes from :meth:`JudgeRequest.pidfd`. None where no server can run here (the caller forks)."""
    if not hasattr(os, "pidfd_open"):
        return None
    try:
        return JudgeRequest((program, [entry.source for entry in entries], bounds, start), fds)
    except OSError as error:  # the server could not even start
        _failed(error)
        return None


def serve(fd: int, judge_main, warm) -> None:
    """The server's loop: per request, fork a judge running ``judge_main`` and answer its pidfd; reap the
    judges that ended. ``warm()`` first imports what every judge would (the pure standard modules)."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        os._exit(1)  # no pidfd here (Linux < 5.3): before any fork, so the reward process forks its judges
    warm()
    sock = socket.socket(fileno=fd)
    judges: set[int] = set()
    while True:
        try:
            payload, fds = _receive(sock, 3)
        except (EOFError, ConnectionError):
            for pid in judges:  # the reward process has gone (killed): so do the judges it cannot kill now
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            os._exit(0)
        judges -= _reaped()
        try:
            pidfd = _fork_one(sock, payload, fds, judges, judge_main)
        except BaseException as error:  # noqa: BLE001 - the request fails, the server goes on
            _send(sock, f"error: {error!r}".encode(), [])
            continue
        _send(sock, b"ok", [pidfd])
        os.close(pidfd)


def _fork_one(sock: socket.socket, payload: bytes, fds: list[int], judges: set[int], judge_main) -> int:
    """Fork the judge of one request (it never returns); a pidfd of it. The request's descriptors are the judge's."""
    from hybridflow.rewards import sandbox_judge

    try:
        program, sources, bounds, start = pickle.loads(payload)
        entries = sandbox_judge.parse_assert_tests(sources)
        server = os.getpid()
        pid = os.fork()
        if pid == 0:
            sock.close()
            _die_with(server)
            judge_main(program, entries, (fds[0], fds[1]), fds[2], bounds, start)
    finally:
        for descriptor in fds:
            os.close(descriptor)  # in the server: the judge holds its own copies
    judges.add(pid)
    try:
        return os.pidfd_open(pid)
    except OSError:
        os.kill(pid, signal.SIGKILL)  # a judge the reward process could not kill must not run
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

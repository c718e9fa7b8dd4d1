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

Where it cannot start (no ``pidfd_open``: Linux < 5.3), :func:`fork_judge` returns None and the
caller forks the judge itself.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading

_HEADER = struct.Struct("!Q")
_ANSWER_S = 30.0  # a server that does not answer a fork in this long is replaced (it forks, nothing more)
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

    def fork(self, request: tuple, fds: list[int]) -> int:
        with self.lock:
            try:
                _send(self.sock, pickle.dumps(request), fds)
                answer, pidfds = _receive(self.sock, 1)
            except BaseException:
                self.stop()  # the conversation is lost mid-way: the next sample starts a new server
                raise
        if answer != b"ok" or len(pidfds) != 1:
            for fd in pidfds:
                os.close(fd)
            raise OSError(f"the judge server could not fork a judge: {answer[:200]!r}")
        return pidfds[0]

    def stop(self) -> None:
        self.sock.close()
        self.process.kill()
        self.process.wait()


_SERVERS: list[_Server] = []


def fork_judge(program: str, entries: list, fds: list[int], bounds, start: float) -> int | None:
    """A pidfd of a fresh judge forked by the server with ``fds`` (the channel's two ends, then the
    results pipe's write end), or None where the server cannot run here (the caller forks it)."""
    if not hasattr(os, "pidfd_open"):
        return None
    server = next((s for s in _SERVERS if s.pid == os.getpid() and s.process.poll() is None and s.sock.fileno() >= 0),
                  None)  # fmt: skip
    for attempt in range(2):  # a server that died (killed from outside) is started again, once
        if server is None:
            _SERVERS[:] = [_Server()]
            server = _SERVERS[0]
        try:
            return server.fork((program, [entry.source for entry in entries], bounds, start), fds)
        except (OSError, EOFError):
            if attempt:
                raise
            server = None
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
        pid = os.fork()
        if pid == 0:
            sock.close()
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


def _reaped() -> set[int]:
    """The judges that ended since the last call, reaped."""
    ended = set()
    try:
        while (pid := os.waitpid(-1, os.WNOHANG)[0]) != 0:
            ended.add(pid)
    except ChildProcessError:
        pass
    return ended

"""Persistent scoring processes whose stuck tasks are killed, not waited for.

``concurrent.futures.ProcessPoolExecutor`` cannot cancel a task once it runs, so one
hung scorer (a regex blow-up, a sympy simplification that never ends) would hang the
whole training step. Here every worker is a process of our own with one task in
flight at a time and a deadline: when the deadline passes the worker is killed
(SIGKILL) and a fresh one takes its place; the sample is reported as timed out, and the
temp dirs of the code sandboxes it had started are removed.

Workers start with the ``spawn`` context (``forkserver`` also works): a fork of a
trainer holding torch threads and CUDA state is not safe. They stay up between calls
so that imports (math-verify, reasoning-gym) are paid once per worker, and the
deadline starts when the worker has unpickled the task -- so it bounds the scorer's
own run time, not a fresh worker's imports.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

from hybridflow.errors import ConfigError
from hybridflow.rewards.code_sandbox import remove_leftovers
from hybridflow.rewards.result import SampleScore, score_sample

# Bound on starting a worker / unpickling a task (imports included), so that even a
# user file that hangs at import cannot hang the run.
STARTUP_TIMEOUT_S = 120.0


def _worker_main(conn: Connection, preload: tuple[str, ...]) -> None:
    """Worker loop: receive ``(fn_bytes, args, kwargs)``, answer 'started' then the score."""
    import importlib

    from hybridflow.rewards.registry import _load_builtin_scorers

    # Heavy scorer imports happen here, before 'ready', so they never eat into a
    # sample's time-out (a fresh worker would otherwise time out its first sample).
    for module in preload:
        importlib.import_module(module)
    _load_builtin_scorers()
    conn.send("ready")
    functions: dict[bytes, object] = {}
    while True:
        try:
            fn_bytes, args, kwargs = conn.recv()
        except EOFError:
            return
        if fn_bytes not in functions:
            functions.clear()  # one scorer per manager: keep the cache tiny
            functions[fn_bytes] = pickle.loads(fn_bytes)
        conn.send("started")
        conn.send(score_sample(functions[fn_bytes], args, kwargs))


@dataclass
class _Worker:
    """A worker process and its state: 'starting' -> 'idle' -> 'queued' -> 'running' -> 'idle'."""

    process: mp.process.BaseProcess
    conn: Connection
    state: str = "starting"
    index: int | None = None  # the task in flight
    deadline: float = 0.0


DEFAULT_PRELOAD = ("math_verify", "reasoning_gym")


class ScoringPool:
    """``num_workers`` scoring processes with a per-sample ``timeout_s`` (None: no limit).

    ``preload`` names modules each worker imports when it starts, outside any time-out
    (the built-in scorers' heavy dependencies by default; ``()`` for a light custom scorer).
    """

    def __init__(
        self,
        *,
        num_workers: int,
        timeout_s: float | None,
        mp_context: str = "spawn",
        preload: tuple[str, ...] = DEFAULT_PRELOAD,
    ):
        if num_workers < 1:
            raise ConfigError(f"reward num_workers must be >= 1, got {num_workers}")
        if timeout_s is not None and timeout_s <= 0:
            raise ConfigError(f"reward timeout_s must be > 0 seconds (or None for no limit), got {timeout_s}")
        self.num_workers = num_workers
        self.timeout_s = float("inf") if timeout_s is None else float(timeout_s)
        self._context = mp.get_context(mp_context)
        self.preload = tuple(preload)
        self._workers: list[_Worker] = []

    def _start_worker(self) -> _Worker:
        # Not waited for: workers start concurrently and report 'ready' to _collect.
        parent_conn, child_conn = self._context.Pipe()
        process = self._context.Process(
            target=_worker_main, args=(child_conn, self.preload), daemon=True, name="hybridflow-reward"
        )
        process.start()
        child_conn.close()
        return _Worker(process=process, conn=parent_conn, deadline=time.monotonic() + STARTUP_TIMEOUT_S)

    def _replace(self, worker: _Worker) -> None:
        worker.process.kill()
        worker.process.join()
        worker.conn.close()
        remove_leftovers(worker.process.pid)  # a sandbox it ran dies with it (bwrap --die-with-parent)
        self._workers[self._workers.index(worker)] = self._start_worker()

    def _dispatch(self, worker: _Worker, index: int, payload: tuple) -> None:
        worker.conn.send(payload)
        worker.state, worker.index = "queued", index
        worker.deadline = time.monotonic() + STARTUP_TIMEOUT_S

    def _receive(self, worker: _Worker) -> SampleScore | None:
        """Advance ``worker`` by one message; the finished sample's score, else None."""
        message = worker.conn.recv()
        if message == "ready":
            worker.state = "idle"
        elif message == "started":
            worker.state, worker.deadline = "running", time.monotonic() + self.timeout_s
        else:
            worker.state, worker.index = "idle", None
            return message
        return None

    def map(self, fn, tasks: list[tuple[tuple, dict]]) -> list[SampleScore]:
        """Score ``fn(*args, **kwargs)`` for each ``(args, kwargs)``, in order."""
        while len(self._workers) < self.num_workers:
            self._workers.append(self._start_worker())
        fn_bytes = pickle.dumps(fn)
        pending = deque(enumerate(tasks))
        results: list[SampleScore | None] = [None] * len(tasks)
        while pending or any(w.index is not None for w in self._workers):
            for worker in self._workers:
                if worker.state == "idle" and pending:
                    index, (args, kwargs) = pending.popleft()
                    self._dispatch(worker, index, (fn_bytes, args, kwargs))
            self._collect(results, tasks)
        return results

    def _fail(self, worker: _Worker, results: list, tasks: list, reason: str, timed_out: bool) -> None:
        """Kill and replace ``worker``; its sample (if any) fails with ``reason``."""
        if worker.index is None and worker.state == "starting":
            raise RuntimeError(f"a reward worker process could not start ({reason}); see its stderr above")
        if worker.index is not None:
            data_source = tasks[worker.index][0][0]
            results[worker.index] = SampleScore(score=None, failure=f"{data_source}: {reason}", timed_out=timed_out)
        self._replace(worker)

    def _collect(self, results: list, tasks: list) -> None:
        """Wait for the next message or deadline and handle what happened."""
        waiting = [w for w in self._workers if w.state != "idle"]
        wait_s = max(0.0, min(w.deadline for w in waiting) - time.monotonic())
        ready = wait([w.conn for w in waiting], timeout=min(wait_s, 3600.0))
        for worker in waiting:
            if worker.conn in ready:
                index = worker.index
                try:
                    outcome = self._receive(worker)
                except (EOFError, OSError):  # the worker died: segfault, os._exit, OOM kill
                    self._fail(worker, results, tasks, "reward worker process died", timed_out=False)
                    continue
                if outcome is not None:
                    results[index] = outcome
            elif time.monotonic() >= worker.deadline:
                limit = self.timeout_s if worker.state == "running" else STARTUP_TIMEOUT_S
                self._fail(worker, results, tasks, f"timed out after {limit:g} s", timed_out=worker.state == "running")

    def close(self) -> None:
        """Stop all workers (idempotent)."""
        for worker in self._workers:
            worker.conn.close()
            worker.process.kill()
            worker.process.join()
        self._workers = []

    def __del__(self):
        try:
            self.close()
        except Exception:  # at interpreter shutdown the modules may already be gone
            pass

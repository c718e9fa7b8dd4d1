"""How OpenMP's worker threads wait between parallel regions: chosen once, before torch starts OpenMP.

Every op ATen or oneDNN runs on more than one thread opens an OpenMP parallel region, and a GRPO
step on a CPU opens hundreds of thousands. Between regions libgomp's workers either spin or sleep:

- spinning briefly keeps them awake for the next region: on an idle machine a GRPO step is
  1.4-1.8x faster than with sleeping workers, whose every wake-up costs ~50 us (docs/benchmarks.md);
- when another process wants the same cores, a spinning worker takes the time slice of the thread
  doing the work, and the same step is ~2x slower than with sleeping workers.

So the default follows the machine at start-up: if the cores this process may use are idle
enough to hold all its OpenMP threads, workers spin for :data:`SPIN_COUNT` iterations (~1 ms)
before sleeping; otherwise they sleep at once (``OMP_WAIT_POLICY=PASSIVE``). ``OMP_WAIT_POLICY``
or ``GOMP_SPINCOUNT`` set by the user is left alone. libgomp reads both variables once, when torch
loads it, hence this runs at ``import hybridflow`` and imports nothing heavy. The policy itself
stays unset when spinning, so libgomp still cuts its spin to 100 iterations whenever its own
threads outnumber the CPUs (two OpenMP teams in one process: a rollout thread beside the update).
The choice is marked in :data:`MARK`, so a process hybridflow starts (a worker, a vLLM server, a benchmark's
child) decides again by the load it finds instead of taking its parent's choice for the user's.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

SPIN_COUNT = 30000
"""libgomp spin iterations before a worker sleeps: ~0.8 ms at the ~28 ns per iteration measured on the
project's 2-core VMs; libgomp's own default is 300000 (~8 ms), which on shared cores wastes the most."""

POLICY_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
MARK = "HYBRIDFLOW_OMP_CHOSEN"
"""Environment variable naming what :func:`apply` set (``NAME=value``), inherited by child processes."""

choice = "OMP_WAIT_POLICY / GOMP_SPINCOUNT not chosen by hybridflow"
_said = False
"""One line on what :func:`apply` chose and why, for a start-up log."""


def runnable_elsewhere(samples: int = 8, interval_s: float = 0.002) -> float | None:
    """Mean number of runnable threads on the machine besides the caller, from ``procs_running`` in
    /proc/stat sampled ``samples`` times ``interval_s`` apart (~15 ms in all); None where there is no
    /proc/stat (not Linux)."""
    counts = []
    for i in range(samples):
        try:
            with open("/proc/stat") as fh:
                running = next(int(line.split()[1]) for line in fh if line.startswith("procs_running"))
        except (OSError, StopIteration, ValueError, IndexError):
            return None
        counts.append(running - 1)  # the reading thread itself is running
        if i + 1 < samples:
            time.sleep(interval_s)
    return max(0.0, sum(counts) / len(counts))


def usable_cores() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def decide(environ, *, cores: int, load: Callable[[], float | None]) -> tuple[dict[str, str], str]:
    """(variables to set, the reason in words) for an environment, the usable cores and ``load()``, the mean
    runnable threads elsewhere (called only where it matters); nothing to set where the user chose, or where
    OpenMP runs one thread (it never waits)."""
    chosen = [name for name in POLICY_VARS if name in environ]
    if chosen:
        return {}, f"OpenMP waits as {', '.join(f'{n}={environ[n]}' for n in chosen)} (set by the user)"
    threads = _omp_threads(environ, cores)
    if threads <= 1:
        return {"OMP_WAIT_POLICY": "PASSIVE"}, "OpenMP runs one thread per process: its workers never wait"
    elsewhere = load()
    if elsewhere is None:
        return ({"OMP_WAIT_POLICY": "PASSIVE"},
                "OpenMP workers sleep between regions (machine load unknown); GOMP_SPINCOUNT=30000 spins ~1 ms")
    if elsewhere + threads <= cores + 0.25:
        return ({"GOMP_SPINCOUNT": str(SPIN_COUNT)},
                f"OpenMP workers spin ~1 ms before sleeping ({threads} threads, {cores} cores idle at start-up); "
                "OMP_WAIT_POLICY=PASSIVE if other processes will share these cores")
    return ({"OMP_WAIT_POLICY": "PASSIVE"},
            f"OpenMP workers sleep between regions ({elsewhere:.1f} threads already running on {cores} cores, "
            f"{threads} wanted); GOMP_SPINCOUNT={SPIN_COUNT} spins ~1 ms on a dedicated machine")


def _omp_threads(environ, cores: int) -> int:
    """The OpenMP team size torch will use: the first entry of ``OMP_NUM_THREADS``, else the usable cores."""
    value = environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(value) if value.isdigit() and int(value) > 0 else cores


def user_settings(environ) -> dict[str, str]:
    """The wait-policy variables the user set: those in ``environ`` unless exactly what a hybridflow parent
    process chose (named in :data:`MARK`)."""
    present = {name: environ[name] for name in POLICY_VARS if name in environ}
    marked = dict(item.split("=", 1) for item in environ.get(MARK, "").split(",") if "=" in item)
    return {} if present and present == marked else present


def apply(environ=os.environ) -> str:
    """Set the wait policy in ``environ`` (before torch loads libgomp) and return the reason line."""
    global choice
    if not user_settings(environ):  # a parent's choice is not the user's: decide for this process's cores
        for name in POLICY_VARS:
            environ.pop(name, None)
    environ.pop(MARK, None)
    updates, choice = decide(environ, cores=usable_cores(), load=runnable_elsewhere)
    environ.update(updates)
    if updates:
        environ[MARK] = ",".join(f"{name}={value}" for name, value in updates.items())
    return choice


def say() -> None:
    """Log :data:`choice` once per process (a CPU run's start-up)."""
    global _said
    if not _said:
        _said = True
        logger.warning("hybridflow: %s", choice)

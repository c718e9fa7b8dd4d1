"""The code sandbox's per-sample bounds, measured on hostile programs (issue 38).

    python benchmarks/sandbox_bounds.py

- fork-and-allocate: four forked children each touch 700 MiB under ``memory_mb=1024``; the peak
  resident memory of this process's whole tree (the sandbox included) is sampled every 2 ms;
- sleep-forever: ``time.sleep(10**6)`` under ``timeout_s=2``: wall time to the result;
- ``/dev/shm``: how many MiB a program holds there in 8 MiB files (each under ``RLIMIT_FSIZE``);
- empty files: how many a program makes in ``/tmp``, ``/sandbox`` and ``/dev/shm`` together (each
  holds ~1.2 KiB of kernel memory no memory limit counts); the script stops at 100,000 a folder.
"""

from __future__ import annotations

import os
import threading
import time

from hybridflow.rewards import code_sandbox
from hybridflow.rewards.sandbox_limits import tree_rss_bytes

FORK_AND_ALLOCATE = """
import os, time
for _ in range(4):
    if os.fork() == 0:
        block = bytearray(700 * 2**20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(30)
        os._exit(0)
time.sleep(5)
print('all held')
"""
FILL_SHM = """
held = 0
try:
    for k in range(256):
        with open(f'/dev/shm/f{k}', 'wb') as f:
            f.write(b'x' * (8 << 20))
        held += 8
except OSError:
    pass
print(held)
"""

FILL_INODES = """
import os
made = 0
for folder in ('/tmp', '/sandbox', '/dev/shm'):
    try:
        for k in range(100_000):
            open(f'{folder}/e{k}', 'w').close()
            made += 1
    except OSError:
        pass
print(made)
"""


def run_with_peak(program: str, **limits) -> tuple[code_sandbox.ExecutionResult, float, float]:
    """(result, peak MiB of resident memory added to this process's tree, wall seconds)."""
    peak, done, base = [0], threading.Event(), tree_rss_bytes(os.getpid())

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], tree_rss_bytes(os.getpid()) - base)
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    start = time.monotonic()
    result = code_sandbox.run_python(program, **limits)
    done.set()
    watcher.join()
    return result, peak[0] / 2**20, time.monotonic() - start


def main() -> None:
    run, peak, wall = run_with_peak(FORK_AND_ALLOCATE, memory_mb=1024, timeout_s=10.0)
    held = "all held" in run.stdout
    print(f"fork 4 x 700 MiB, memory_mb=1024: peak {peak:.0f} MiB, {wall:.2f} s, "
          f"memory_exceeded={getattr(run, 'memory_exceeded', None)}, children held their memory: {held}")
    run, _, wall = run_with_peak("import time\ntime.sleep(10**6)\n", timeout_s=2.0)
    print(f"sleep forever, timeout_s=2: {wall:.2f} s, timed_out={run.timed_out}")
    print(f"/dev/shm: {code_sandbox.run_python(FILL_SHM, timeout_s=20.0).stdout.strip()} MiB held")
    run = code_sandbox.run_python(FILL_INODES, timeout_s=60.0)
    print(f"empty files held in the three writable folders: {run.stdout.strip() or run}")


if __name__ == "__main__":
    main()

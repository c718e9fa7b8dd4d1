"""Decode lanes: on CPU, a wide decode step runs as several narrower ones at once.

Why: every op that ATen or oneDNN parallelises opens an OpenMP parallel region, and with
``OMP_WAIT_POLICY=PASSIVE`` (which hybridflow sets where other processes hold the cores, because
spinning workers made decode 10-25x slower there; hybridflow/omp.py) each region first wakes
sleeping worker threads. On the
2-core VM this project is measured on a wake-up costs ~50 us: a ``[64, 576]`` add takes
55 us on two threads and 4 us on one, and a decode step at 64 live sequences opens ~750
regions. Lanes remove the wake-ups instead of the sleeping: the live slots are cut into
contiguous slices, each slice is decoded (and sampled) by its own Python thread with
``threads // lanes`` intra-op threads (one, on two cores), and the threads run
concurrently because ATen releases the GIL inside its kernels.

The price: every lane streams all the weights. That is free while a step is
compute-bound and not when it is bound by reading the weights, so a lane gets at least
:data:`MIN_ROWS_PER_LANE` sequences; below that the step runs as one batch on all threads.
Measured on SmolLM2-135M, fp32, 2 cores (docs/benchmarks.md): steps over 64-127 live
sequences 15-26 % faster in two lanes, 32-63 about 2-6 %; fewer than 16 per lane is slower.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

import torch

Result = TypeVar("Result")

MIN_ROWS_PER_LANE = 16
"""Fewest live sequences a lane decodes; 16 measured the break-even point on 2 cores."""


class DecodeLanes:
    """Runs ``work(start, stop)`` over contiguous slices of ``range(count)`` concurrently.

    Args:
        threads: intra-op threads to share among the lanes (``torch.get_num_threads()``).
    """

    def __init__(self, threads: int):
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None

    def lanes_for(self, count: int) -> int:
        """How many lanes ``count`` rows get: 1 means run as one batch on all threads."""
        return max(1, min(self.threads, count // MIN_ROWS_PER_LANE))

    def run(self, work: Callable[[int, int], Result], count: int) -> list[Result]:
        """``[work(start, stop) for each slice]`` in slice order; slices cover ``range(count)``."""
        lanes = self.lanes_for(count)
        if lanes == 1:
            return [work(0, count)]
        bounds = [(lane * count // lanes, (lane + 1) * count // lanes) for lane in range(lanes)]
        per_lane = max(1, self.threads // lanes)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.threads - 1, thread_name_prefix="hybridflow-lane")
        outer = torch.get_num_threads()
        torch.set_num_threads(per_lane)
        try:
            others = [self._pool.submit(_with_threads, per_lane, work, *bound) for bound in bounds[1:]]
            try:
                first = work(*bounds[0])
            finally:
                wait(others)  # no lane may still write to shared state once this returns or raises
            return [first] + [future.result() for future in others]
        finally:
            torch.set_num_threads(outer)


def _with_threads(threads: int, work: Callable[[int, int], Result], start: int, stop: int) -> Result:
    # OpenMP's thread count is per calling thread: a pool thread sets its own.
    torch.set_num_threads(threads)
    return work(start, stop)

"""perf/step_peak_rss_gb is the resident peak of the window since the previous call, not of the process."""

import mmap
import sys

import numpy as np
import pytest

from hybridflow.trainer.tracking.metrics import memory_metrics

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM / clear_refs are Linux's")


def test_step_peak_follows_each_window_while_the_process_peak_only_grows():
    memory_metrics()  # start a window
    touch_fresh_pages(400 * 2**20)
    with_big = memory_metrics()
    without = memory_metrics()  # the next window holds no such allocation
    assert with_big["perf/step_peak_rss_gb"] - without["perf/step_peak_rss_gb"] > 0.3
    assert without["perf/max_memory_rss_gb"] >= with_big["perf/step_peak_rss_gb"] > 0.39
    assert without["perf/max_memory_rss_gb"] == pytest.approx(with_big["perf/max_memory_rss_gb"])


def touch_fresh_pages(size: int) -> None:
    """Map ``size`` bytes of new private memory, write every page, unmap it: the resident set grows by ``size`` for a
    moment whatever the allocator holds already (a freed heap the allocator reuses would not raise it; that made
    this test depend on what the tests before it had freed)."""
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        view = np.frombuffer(region, dtype=np.uint8)
        view[:: mmap.PAGESIZE] = 1
        del view
    finally:
        region.close()

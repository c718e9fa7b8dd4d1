"""The CPU heap policy (hybridflow/cpu.py): a CPU training process keeps the pages its steps free.

mallopt is process-wide, so each case runs in its own interpreter and reports what it saw: the first-touch page
faults of a second 64 MiB block after the first one is freed (the kernel counts them: ``ru_minflt``), and whether
``return_freed_memory`` still trims.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from hybridflow.cpu import HEAP_ENV, heap_policy
from hybridflow.errors import ConfigError

pytestmark = pytest.mark.skipif(platform.system() != "Linux", reason="glibc's mallopt: Linux only")

PROBE = r"""
import json, resource, sys
import torch
from hybridflow import cpu
from hybridflow.trainer.entry import resolve_device

kept = resolve_device(sys.argv[1]).type == "cpu" and cpu._heap_kept
faults = []
for _ in range(6):  # allocate, touch every page, free: once the heap has grown, later rounds reuse its pages
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = torch.ones(16 << 20)  # 64 MiB, over glibc's largest mmap threshold (32 MiB)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    del block
print(json.dumps({"kept": kept, "faults": faults, "trimmed": cpu.return_freed_memory()}))
"""


def _probe(device: str = "cpu", policy: str | None = None) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "THP_MEM_ALLOC_ENABLE": "0"}  # count 4 KiB faults: glibc's policy
    env.pop(HEAP_ENV, None)
    if policy is not None:
        env[HEAP_ENV] = policy
    out = subprocess.run([sys.executable, "-c", PROBE, device], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_cpu_process_reuses_the_pages_a_freed_block_had():
    seen = _probe()
    assert seen["kept"] and not seen["trimmed"]
    # 64 MiB is 16,384 pages: the first block faults them in; the heap may grow once more (a small object can
    # land where the block was; seen once in rounds 2-3), then each round finds its pages resident
    assert seen["faults"][0] > 10_000
    assert max(seen["faults"][3:]) < 1_000, seen


def test_trim_leaves_glibc_as_it_is():
    seen = _probe(policy="trim")
    assert not seen["kept"] and seen["trimmed"]
    assert min(seen["faults"]) > 10_000, seen  # every block mapped fresh and given back on free


def test_a_bad_policy_is_refused_with_the_two_choices(monkeypatch):
    monkeypatch.setenv(HEAP_ENV, "never")
    with pytest.raises(ConfigError, match="keep .* or trim"):
        heap_policy()
    monkeypatch.setenv(HEAP_ENV, " Trim ")
    assert heap_policy() == "trim"


THP_PROBE = r"""
import json, os, sys
import hybridflow
import torch
block = torch.ones(16 << 20)  # 64 MiB: torch's allocator madvises buffers of 2 MiB or more when the switch is on
huge = next(int(line.split()[1]) for line in open("/proc/self/smaps_rollup") if line.startswith("AnonHugePages"))
print(json.dumps({"env": os.environ.get("THP_MEM_ALLOC_ENABLE"), "huge_kb": huge}))
"""


def _thp_probe(setting: str | None) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("THP_MEM_ALLOC_ENABLE", None)
    if setting is not None:
        env["THP_MEM_ALLOC_ENABLE"] = setting
    out = subprocess.run([sys.executable, "-c", THP_PROBE], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_large_cpu_buffers_go_on_huge_pages_unless_the_user_says_no():
    mode = open("/sys/kernel/mm/transparent_hugepage/enabled").read() if os.path.exists(
        "/sys/kernel/mm/transparent_hugepage/enabled") else ""
    default, refused = _thp_probe(None), _thp_probe("0")
    assert default["env"] == "1" and refused["env"] == "0"  # a default, never over the user's own value
    assert refused["huge_kb"] == 0 or "[always]" in mode  # "always" gives huge pages whatever torch asks
    if "[madvise]" in mode or "[always]" in mode:  # the kernel may still find no free 2 MiB page: most, not all
        assert default["huge_kb"] >= 32 << 10, default

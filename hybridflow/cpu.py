"""What this CPU is, in one line, for benchmark headers and debug logs.

The project runs on Intel CPUs with AVX-512/AMX and on AMD CPUs with AVX2 only, and the
fast paths differ between them (oneDNN bf16 packing, bf16 matmul speed), so every
benchmark names the ISA it ran on.
"""

from __future__ import annotations

import os
import platform

import torch

# The instruction-set extensions that change which kernels are fast, in the order printed.
_ISA_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_bf16", "avx_ne_convert", "amx_bf16")


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo, or ``platform``'s best guess."""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    """Every feature flag /proc/cpuinfo lists for this CPU (empty where it is absent)."""
    if not os.path.exists("/proc/cpuinfo"):
        return []
    with open("/proc/cpuinfo") as f:
        return next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])


def cpu_isa_flags() -> list[str]:
    """Which of the extensions that matter here this CPU reports (empty where /proc/cpuinfo is absent)."""
    flags = cpu_flags()
    return [flag for flag in _ISA_FLAGS if flag in flags]


def describe_cpu() -> str:
    """E.g. ``AMD EPYC, ISA avx2, torch capability AVX2``."""
    capability = torch.backends.cpu.get_cpu_capability()
    flags = ", ".join(cpu_isa_flags()) or "unknown"
    return f"{cpu_model()}, ISA {flags}, torch capability {capability}"


def return_freed_memory() -> bool:
    """Give the heap's free pages back to the OS (glibc ``malloc_trim``); ``False`` where there is no glibc.

    glibc raises its mmap threshold each time a large block is freed, so later temporaries of that size
    come from the heap, and freed heap pages stay resident. A weight sync frees ~0.4 GB of such
    temporaries on SmolLM2-135M (the fused q|k|v and gate|up concatenations before packing); without a
    trim they stay in the resident set between steps.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if platform.system() != "Linux" or name is None:
        return False
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError):  # musl and other C libraries have no malloc_trim
        return False
    return True

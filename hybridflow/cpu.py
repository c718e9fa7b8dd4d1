"""What this CPU is, in one line, for benchmark headers and debug logs.

The project runs on Intel CPUs with AVX-512/AMX and on AMD CPUs with AVX2 only, and the
fast paths differ between them (oneDNN bf16 packing, bf16 matmul speed), so every
benchmark names the ISA it ran on.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from hybridflow.errors import ConfigError

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


KERNEL_MARCH_ENV = "HYBRIDFLOW_KERNEL_MARCH"
"""``-march`` of the C kernels' builds: ``native`` (default, the machine it runs on), or e.g. ``haswell`` to build the
AVX2 code an AVX2-only machine gets (tests build that one too)."""


def kernel_march_flag() -> str:
    return f"-march={os.environ.get(KERNEL_MARCH_ENV) or 'native'}"


def c_compiler() -> str | None:
    """``$CC`` (default gcc), else ``cc``; ``None`` where neither is found."""
    return shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")


def build_c_library(csrc: Path, stem: str, flags: tuple[str, ...], compiler: str, cache: Path) -> Path:
    """The shared library of ``csrc/*.c`` built with ``flags``: ``cache/<stem>-<key>.so``, built unless there.

    The key hashes the sources and headers of ``csrc``, the flags, the compiler's version and this CPU's flags
    (``-march=native`` builds differ between CPUs); the file is written atomically (a concurrent process sees the
    old state or the whole library). Raises ``subprocess.CalledProcessError`` where the build fails.
    """
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    texts = [path.read_text() for path in sorted(csrc.glob("*.[ch]"))]
    key = hashlib.sha256("\0".join([*texts, " ".join(flags), version, " ".join(cpu_flags())]).encode())
    target = cache / f"{stem}-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        subprocess.run([compiler, *flags, "-o", str(built), *map(str, sorted(csrc.glob("*.c"))), "-lm"],
                       capture_output=True, text=True, check=True)
        os.replace(built, target)
    return target


def load_c_library(csrc: Path, stem: str, flags: tuple[str, ...], cache: Path, signatures: dict[str, list], *,
                   logger: logging.Logger, no_compiler: str, failed: str) -> ctypes.CDLL | None:
    """:func:`build_c_library`'s library loaded, each of ``signatures``' functions typed (returning ``int``); or
    ``None`` after logging ``no_compiler`` (no compiler found) or ``failed`` (``%s``: the build's last error line)."""
    compiler = c_compiler()
    if compiler is None:
        logger.warning(no_compiler)
        return None
    try:
        loaded = ctypes.CDLL(str(build_c_library(csrc, stem, flags, compiler, cache)))
    except (OSError, subprocess.CalledProcessError) as err:
        detail = (getattr(err, "stderr", "") or str(err)).strip()
        logger.warning(failed, detail.splitlines()[-1] if detail else err)
        return None
    for name, argtypes in signatures.items():
        function = getattr(loaded, name)
        function.argtypes, function.restype = argtypes, ctypes.c_int
    return loaded


def describe_cpu() -> str:
    """E.g. ``AMD EPYC, ISA avx2, torch capability AVX2``."""
    capability = torch.backends.cpu.get_cpu_capability()
    flags = ", ".join(cpu_isa_flags()) or "unknown"
    return f"{cpu_model()}, ISA {flags}, torch capability {capability}"


HEAP_ENV = "HYBRIDFLOW_CPU_HEAP"
"""``keep`` (the default of a CPU training process: :func:`keep_freed_heap`) or ``trim`` (glibc's own policy, and
:func:`return_freed_memory` trims after each weight sync: a smaller resident set between steps, slower steps)."""
_HEAP_POLICIES = ("keep", "trim")
_INT_MAX = 2**31 - 1  # mallopt takes a C int: a larger Python int would be cut to its low 32 bits (1 << 40 -> 0)
_KEPT_HEAP = (("MMAP_MAX", -4, 0), ("TRIM_THRESHOLD", -1, _INT_MAX), ("TOP_PAD", -2, 64 << 20))
""":func:`keep_freed_heap`'s policy: (glibc's name, its mallopt parameter from malloc.h, the value)."""
_heap_kept = False


@functools.cache
def _libc():
    """glibc through ctypes, or None (not Linux, musl and other C libraries: no mallopt / malloc_trim); looked up
    once (``find_library`` runs ``ldconfig``), not at every weight sync."""
    import ctypes.util

    name = ctypes.util.find_library("c")
    if platform.system() != "Linux" or name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def heap_policy() -> str:
    """``HYBRIDFLOW_CPU_HEAP``, checked: ``keep`` unless set to ``trim``."""
    policy = os.environ.get(HEAP_ENV, "keep").strip().lower() or "keep"
    if policy not in _HEAP_POLICIES:
        raise ConfigError(f"{HEAP_ENV}={os.environ[HEAP_ENV]!r} is not a heap policy: use keep (fast steps) or trim "
                          "(a smaller resident set between steps)")
    return policy


def keep_freed_heap() -> bool:
    """Serve every block from glibc's heap and keep freed pages resident, for the rest of this process; returns
    whether it took effect (``HYBRIDFLOW_CPU_HEAP=trim`` or no glibc: ``False``, nothing changed).

    Why: glibc serves blocks over its mmap threshold (at most 32 MiB) with a fresh ``mmap`` and gives them back on
    free, and trims the heap's free top, so each training step touches its logits, gradients and activations as new
    pages: ~500k first-touch page faults an update on SmolLM2-135M, at ~3.5 us each in a VM
    (docs/benchmarks.md). With mmap off and no trimming, a step reuses the pages the step before it freed; the
    resident set stays at the process's peak (the page cache of jemalloc / tcmalloc, without preloading either).
    """
    global _heap_kept
    if _heap_kept:
        return True
    libc = _libc() if heap_policy() == "keep" else None
    if libc is None:
        return False
    _heap_kept = all(libc.mallopt(parameter, value) for _, parameter, value in _KEPT_HEAP)
    return _heap_kept


def kept_heap_environment() -> dict[str, str]:
    """:func:`keep_freed_heap`'s policy as the ``MALLOC_*_`` variables glibc reads when a process starts: for a
    process that does not run hybridflow (a benchmark's baseline given the same heap)."""
    return {f"MALLOC_{name}_": str(value) for name, _, value in _KEPT_HEAP}


def return_freed_memory() -> bool:
    """Give the heap's free pages back to the OS (glibc ``malloc_trim``); ``False`` where there is no glibc, or
    where :func:`keep_freed_heap` keeps them for the next step instead.

    glibc raises its mmap threshold each time a large block is freed, so later temporaries of that size
    come from the heap, and freed heap pages stay resident. A weight sync frees ~0.4 GB of such
    temporaries on SmolLM2-135M (the fused q|k|v and gate|up concatenations before packing); without a
    trim they stay in the resident set between steps.
    """
    libc = None if _heap_kept else _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


# ----------------------------------------------------------------------------- bf16 units 
CPU_BF16_ENV = "HYBRIDFLOW_CPU_BF16"
"""``0`` forces the fp32 fallback (as on an AVX2-only CPU; tests that pin bits set it), ``1`` forces bf16 compute
on any CPU (slow without bf16 units: for testing the bf16 code paths there); unset, :func:`cpu_has_bf16` detects."""

_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_bf16_units() -> list[str]:
    """The bf16 matmul extensions this CPU has (``avx512_bf16``, ``amx_bf16``), from /proc/cpuinfo, else from
    torch's own cpuinfo probe (non-Linux); empty where it has none (AVX2-only CPUs emulate bf16 27-161x slower)."""
    flags = cpu_flags()
    if flags:
        return [flag for flag in _BF16_FLAGS if flag in flags]
    probes = {"avx512_bf16": "_is_avx512_bf16_supported", "amx_bf16": "_is_amx_tile_supported"}
    return [flag for flag, probe in probes.items() if getattr(torch.cpu, probe, lambda: False)()]


def cpu_has_bf16() -> bool:
    """Whether CPU compute should default to bf16: ``HYBRIDFLOW_CPU_BF16`` when set (``0`` / ``1``), else whether
    the CPU has bf16 units and torch's oneDNN reaches them (``mkldnn._is_mkldnn_bf16_supported``)."""
    forced = os.environ.get(CPU_BF16_ENV, "").strip()
    if forced:
        if forced not in ("0", "1"):
            raise ConfigError(f"{CPU_BF16_ENV}={forced!r}: set it to 0 (fp32 on this CPU) or 1 (bf16), or unset it "
                              "to detect the CPU's bf16 units")
        return forced == "1"
    return bool(cpu_bf16_units()) and onednn_bf16()


def onednn_bf16() -> bool:
    """Whether torch's oneDNN runs bf16 kernels on this CPU (it needs AVX-512 or AVX-NE-CONVERT)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def cpu_precision_reason() -> str:
    """Why :func:`cpu_has_bf16` said what it said, for the one start-up line."""
    forced = os.environ.get(CPU_BF16_ENV, "").strip()
    if forced:
        return f"{CPU_BF16_ENV}={forced}"
    units = cpu_bf16_units()
    return f"this CPU has {' and '.join(units)}" if units else "this CPU has no AVX-512-BF16 / AMX: bf16 is slow here"

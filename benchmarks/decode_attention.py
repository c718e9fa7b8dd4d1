"""Paged decode attention at the copy bandwidth? A sweep of the Triton kernel's configurations (issue 46).

One layer's decode attention (:func:`hybridflow.rollout.triton_attention.paged_decode_attention`) at the shapes
the engine runs, each configuration checked against a torch reference, then timed (CUDA events, one warm-up, the
median of ``--repeats``); reported as the live keys and values it reads (``2 x sum(lengths) x KV x D x bytes``)
per second, against the device-to-device copy bandwidth measured in the same run. Beside the sweep: the first
kernel's configuration (``MAIN_CONFIG``, the baseline every ratio is against), torch SDPA over keys gathered
and padded to the longest row (it reads more than the live bytes: the rate shown is still live bytes over its
time), and ``flash_attn.flash_attn_with_kvcache`` over a paged copy of the cache when ``flash_attn`` imports (its
pages must be multiples of 256 positions, so its cache has pages of 256, not the engine's 16).

Shapes (``--shapes``): Qwen3-0.6B (16 heads, 8 KV heads of 128) at 256 rows of lengths drawn from 100-2,048
(nano-vllm's workload: prompts and outputs of 100-1,024) and at 256 rows of 1,000; SmolLM2-135M (9 / 3 heads of
64) at 64 and 256 rows; Qwen2.5-1.5B (12 / 2 heads of 128) at 256 rows; bf16, pages of 16, a block table as wide
as the engine's for a 2,048-position cache, blocks shuffled over the pool. The Qwen3 shapes run the full sweep
(~15 configurations around the chooser's), the others a short one; the pool is copied often enough that
the rotation through the copies does not fit in L2 (a step's other layers evict it).

    python3 benchmarks/decode_attention.py                 # CUDA, < 60 s on an H200 (gpu_check's `attn` stage)
    python3 benchmarks/decode_attention.py --shapes qwen3-nano --repeats 50
    python3 benchmarks/decode_attention.py --smoke         # CPU: the interpreter, tiny shapes (correctness, the report)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys
import time
from dataclasses import dataclass

import torch

if "--smoke" in sys.argv and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton loads: the kernels run in its interpreter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rollout import copy_bandwidth  # noqa: E402 -- the same copy as the engine benchmark's roofline

try:
    from hybridflow.rollout.triton_attention import (MAIN_CONFIG, DecodeConfig, choose_config,  # noqa: E402
                                                     paged_decode_attention)
except ImportError as missing:  # gpu_check's `attn` stage: an image without Triton skips it in one line
    if __name__ != "__main__":
        raise
    print(f"decode_attention: skipped, Triton does not import ({missing})")
    sys.exit(0)

PAGE = 16
TOLERANCE = 1e-2
"""Largest relative error against the fp32 reference a bf16 configuration may have and be timed."""
L2_ROTATION_BYTES = 512 << 20
"""Bytes of cache copies timed in rotation: ten times an H200's 50 MB L2."""


@dataclass(frozen=True)
class Shape:
    name: str
    rows: int
    heads: int
    kv_heads: int
    head_dim: int
    lengths: str
    """``"nano"``: uniform in 100-``span`` (seeded); numbers (``"1000"``, ``"1,150"``): the rows' lengths, in turn."""
    span: int = 2048
    """Positions the block table spans (its width x the page)."""
    full_sweep: bool = False


SHAPES = [
    Shape("qwen3-nano", 256, 16, 8, 128, "nano", full_sweep=True),
    Shape("qwen3-1000", 256, 16, 8, 128, "1000", full_sweep=True),
    Shape("smollm2-64", 64, 9, 3, 64, "nano"),
    Shape("smollm2-256", 256, 9, 3, 64, "nano"),
    Shape("qwen2.5-1.5b", 256, 12, 2, 128, "nano"),
]
SMOKE_SHAPES = [  # the interpreter: two rows; groups of 2 and 3, a row of one key, splits and one split a row
    Shape("smoke-gqa2", 2, 4, 2, 64, "1,150", span=512, full_sweep=True),
    Shape("smoke-gqa3", 2, 6, 2, 32, "1,37", span=256),
]


def row_lengths(shape: Shape) -> list[int]:
    if shape.lengths == "nano":
        rng = random.Random(0)
        return [rng.randint(100, shape.span) for _ in range(shape.rows)]
    cycle = [int(length) for length in shape.lengths.split(",")]
    return [cycle[row % len(cycle)] for row in range(shape.rows)]


@dataclass
class Problem:
    """One layer's decode attention: ``q`` ``[N, H, D]``, pools ``[KV, blocks, PAGE, D]`` (``copies`` of them, timed
    in rotation), the tables ``[N, W]`` over shuffled blocks, the lengths ``[N]``."""

    q: torch.Tensor
    pools: list[tuple[torch.Tensor, torch.Tensor]]
    tables: torch.Tensor
    lengths: torch.Tensor
    scale: float

    @property
    def live_bytes(self) -> int:
        keys = self.pools[0][0]
        return 2 * int(self.lengths.sum()) * keys.shape[0] * keys.shape[3] * keys.element_size()

    def run(self, config: DecodeConfig | None, copy: int = 0) -> torch.Tensor:
        keys, values = self.pools[copy % len(self.pools)]
        return paged_decode_attention(q=self.q, keys=keys, values=values, lengths=self.lengths, scale=self.scale,
                                      block_tables=self.tables, config=config)


def build_problem(shape: Shape, *, dtype: torch.dtype, device: str, rotate: bool) -> Problem:
    lengths = row_lengths(shape)
    width = shape.span // PAGE
    needed = [-(-length // PAGE) for length in lengths]
    generator = torch.Generator().manual_seed(0)
    order = (torch.randperm(sum(needed), generator=generator) + 1).tolist()  # block 0: the null block
    tables = torch.zeros(shape.rows, width, dtype=torch.int32)
    for row, count in enumerate(needed):
        tables[row, :count] = torch.tensor(order[:count], dtype=torch.int32)
        order = order[count:]
    blocks = sum(needed) + 1
    pool_bytes = 2 * shape.kv_heads * blocks * PAGE * shape.head_dim * dtype.itemsize
    copies = min(16, -(-L2_ROTATION_BYTES // pool_bytes)) if rotate else 1
    pools = [tuple(torch.randn(shape.kv_heads, blocks, PAGE, shape.head_dim, device=device, dtype=dtype)
                   for _ in range(2)) for _ in range(copies)]
    q = torch.randn(shape.rows, shape.heads, shape.head_dim, device=device, dtype=dtype)
    return Problem(q=q, pools=pools, tables=tables.to(device), lengths=torch.tensor(lengths, device=device),
                   scale=shape.head_dim**-0.5)


def gathered(problem: Problem, copy: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keys and values of each row gathered from its blocks, ``[N, KV, W * PAGE, D]``, and the ``[N, 1, 1, W * PAGE]``
    mask of its live positions: what SDPA reads (every row padded to the table's span)."""
    keys, values = problem.pools[copy]
    rows, width = problem.tables.shape
    flat = problem.tables.reshape(-1).long()

    def gather(pool):
        kv_heads, _, page, dim = pool.shape
        return pool.index_select(1, flat).view(kv_heads, rows, width * page, dim).transpose(0, 1)

    span = width * keys.shape[2]
    live = torch.arange(span, device=keys.device)[None] < problem.lengths[:, None]
    return gather(keys), gather(values), live[:, None, None]


def sdpa(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, live: torch.Tensor, scale: float) -> torch.Tensor:
    """``[N, H, D]`` attention of one query a row over its gathered keys (grouped heads as the KV heads' queries)."""
    rows, heads, dim = q.shape
    grouped = q.view(rows, keys.shape[1], heads // keys.shape[1], dim)
    out = torch.nn.functional.scaled_dot_product_attention(grouped, keys, values, attn_mask=live, scale=scale)
    return out.reshape(rows, heads, dim)


def reference(problem: Problem) -> torch.Tensor:
    """fp32 SDPA over the gathered blocks (the first copy of the pool): what every configuration must give."""
    keys, values, live = gathered(problem)
    return sdpa(problem.q.float(), keys.float(), values.float(), live, problem.scale)


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.float() - expected).norm() / expected.norm())


def median_ms(work, repeats: int) -> float:
    """Median milliseconds of ``work(i)`` (``i`` the call's index: which pool copy) after a warm-up: CUDA events on
    a GPU, the wall clock on a CPU (the smoke run: the interpreter's times mean nothing, the code path is the same)."""
    cuda = torch.cuda.is_available()
    if cuda:  # Triton compiles, caches warm; the interpreter has neither
        work(0)
    times = []
    for i in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            work(i + 1)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            work(i + 1)
            times.append((time.perf_counter() - began) * 1e3)
    return sorted(times)[len(times) // 2]


def sweep(chosen: DecodeConfig, *, span: int, full: bool) -> list[DecodeConfig]:
    """The baseline, the chooser's config, and variations of the chooser's one knob at a time: the other split
    lengths (256 / 512 / 1,024 / one split a row), pipeline stages (1: none; 2; 5: two tiles ahead, the table
    load taking a stage), V after the softmax without pipelining (with it the compiled kernels are the same),
    2 and 8 warps, half and double tiles, half tiles 5 stages deep. The short sweep: the next shorter and longer
    split, and 5 stages."""
    replace = dataclasses.replace
    whole = -(-span // chosen.block_n) * chosen.block_n
    splits = sorted({length for length in (256, 512, 1024, whole)
                     if length <= whole and length % chosen.block_n == 0} - {chosen.split_len})
    if not full:
        shorter = [length for length in splits if length < chosen.split_len][-1:]
        splits = shorter + [length for length in splits if length > chosen.split_len][:1]
    configs = [MAIN_CONFIG, chosen] + [replace(chosen, split_len=length) for length in splits]
    configs += [replace(chosen, num_stages=stages) for stages in ((1, 2, 5) if full else (5,))]
    if full:
        configs.append(replace(chosen, num_stages=1, kv_together=False))
        configs += [replace(chosen, num_warps=warps) for warps in (2, 8)]
        for block_n in (chosen.block_n // 2, chosen.block_n * 2):
            if 16 <= block_n <= 128:
                configs.append(replace(chosen, block_n=block_n, split_len=-(-chosen.split_len // block_n) * block_n))
        if chosen.block_n >= 32:
            configs.append(replace(chosen, block_n=chosen.block_n // 2, num_stages=5))
    return list(dict.fromkeys(configs))  # in order, once each


def sdpa_row(problem: Problem, repeats: int) -> str:
    """torch SDPA over the keys and values gathered and padded to the span (the gather not timed)."""
    keys, values, live = gathered(problem)
    ms = median_ms(lambda _: sdpa(problem.q, keys, values, live, problem.scale), repeats)
    return (f"{'torch SDPA (gathered, padded to the span)':44s} {ms:7.3f} ms "
            f"{problem.live_bytes / ms / 1e9:5.2f} TB/s (live bytes over its time)")


def flash_attn_row(problem: Problem, expected: torch.Tensor, repeats: int) -> str:
    """``flash_attn_with_kvcache`` over the same keys and values in pages of 256 (its smallest paged block)."""
    try:
        from flash_attn import flash_attn_with_kvcache
    except ImportError as error:
        return f"flash_attn: absent ({type(error).__name__}: {str(error).splitlines()[0][:80]})"
    keys, values, _ = gathered(problem)  # [N, KV, span, D]
    rows, kv_heads, span, dim = keys.shape
    page = 256
    pages = -(-span // page)

    def paged(part):  # [N * pages, 256, KV, D]: row n's page p is block n * pages + p
        padded = torch.nn.functional.pad(part, (0, 0, 0, pages * page - span))
        return padded.view(rows, kv_heads, pages, page, dim).permute(0, 2, 3, 1, 4).reshape(-1, page, kv_heads, dim)

    k_cache, v_cache = paged(keys).contiguous(), paged(values).contiguous()
    table = torch.arange(rows * pages, device=keys.device, dtype=torch.int32).view(rows, pages)
    lengths = problem.lengths.to(torch.int32)

    def run(_):
        return flash_attn_with_kvcache(problem.q[:, None], k_cache, v_cache, cache_seqlens=lengths, block_table=table,
                                       softmax_scale=problem.scale)[:, 0]

    error = relative_error(run(0), expected)
    if not error < TOLERANCE:
        return f"flash_attn: WRONG against the reference (relative error {error:.3g}), not timed"
    ms = median_ms(run, repeats)
    return (f"{'flash_attn_with_kvcache (pages of 256)':44s} {ms:7.3f} ms "
            f"{problem.live_bytes / ms / 1e9:5.2f} TB/s")


def run_shape(shape: Shape, args, bandwidth: float, deadline: float) -> list[str]:
    """The sweep at one shape: its lines (each configuration's time, rate and ratio to the baseline; the best)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    problem = build_problem(shape, dtype=torch.bfloat16, device=device, rotate=not args.smoke)
    chosen = choose_config(rows=shape.rows, heads=shape.heads, kv_heads=shape.kv_heads, head_dim=shape.head_dim,
                           page=PAGE, width=problem.tables.shape[1], dtype=problem.q.dtype,
                           sms=torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else 132)
    expected = reference(problem)
    live = problem.live_bytes
    lines = [f"shape {shape.name}: {shape.rows} rows x {shape.heads}/{shape.kv_heads} heads of {shape.head_dim}, "
             f"lengths {min(problem.lengths.tolist())}-{max(problem.lengths.tolist())} (mean "
             f"{problem.lengths.float().mean():.0f}), {live / 1e9:.3f} GB of live keys and values, "
             f"{len(problem.pools)} pool copies; floor {live / bandwidth * 1e3:.3f} ms at the copy bandwidth"]
    timings: dict[DecodeConfig, float] = {}
    for config in sweep(chosen, span=shape.span, full=shape.full_sweep):
        name = ("main " if config == MAIN_CONFIG else "chosen " if config == chosen else "") + config.label()
        if time.monotonic() > deadline:  # before the check: it compiles the kernel
            lines.append(f"  {name:44s} skipped: the run's --budget is spent")
            continue
        error = relative_error(problem.run(config), expected)
        if not error < TOLERANCE:  # a wrong kernel is never timed, so it never wins
            lines.append(f"  {name:44s} WRONG: relative error {error:.3g} against the reference, not timed")
            continue
        ms = median_ms(lambda i, config=config: problem.run(config, i), args.repeats)
        timings[config] = ms
        rate = live / (ms / 1e3)
        ratio = timings[MAIN_CONFIG] / ms if MAIN_CONFIG in timings else float("nan")
        lines.append(f"  {name:44s} {ms:7.3f} ms {rate / 1e12:5.2f} TB/s {100 * rate / bandwidth:5.1f} % of copy  "
                     f"{ratio:4.2f}x main")
    lines.append("  " + sdpa_row(problem, args.repeats))
    lines.append("  " + flash_attn_row(problem, expected, args.repeats))
    if timings:
        best = min(timings, key=timings.get)
        rate = live / (timings[best] / 1e3)
        speedup = timings.get(MAIN_CONFIG, float("nan")) / timings[best]
        lines.append(f"best at {shape.name}: {best.label()} {timings[best]:.3f} ms, {rate / 1e12:.2f} TB/s = "
                     f"{100 * rate / bandwidth:.1f} % of copy, {speedup:.2f}x main"
                     f"{'' if best == chosen else f' (the chooser picked {chosen.label()})'}")
    return lines


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=None, help="comma-separated names (default: all of them)")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per configuration (the median is shown)")
    parser.add_argument("--budget", type=float, default=50.0,
                        help="seconds after which configurations are no longer timed (a line says so)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes: correctness and the report (on a CPU in the interpreter; times mean nothing)")
    return parser.parse_args(argv)


def main(argv=None) -> list[str]:
    args = parse_args(argv)
    start = time.monotonic()
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    if args.shapes:
        wanted = args.shapes.split(",")
        unknown = sorted(set(wanted) - {shape.name for shape in shapes})
        if unknown:
            raise SystemExit(f"unknown shape(s) {unknown}: choose from {[shape.name for shape in shapes]}")
        shapes = [shape for shape in shapes if shape.name in wanted]
    cuda = torch.cuda.is_available()
    if not args.smoke and not cuda:
        raise SystemExit("decode_attention.py times CUDA kernels: run it on a GPU, or with --smoke on a CPU")
    if args.smoke and not cuda:
        args.repeats = 1  # the interpreter: correctness, and the report's code path
    bandwidth = copy_bandwidth("cuda" if cuda else "cpu", megabytes=1024 if cuda else 64)
    device = torch.cuda.get_device_name() if cuda else "CPU (Triton's interpreter: times and rates mean nothing)"
    lines = [f"{device}: copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write)"]
    print(lines[-1], flush=True)
    for shape in shapes:
        for line in run_shape(shape, args, bandwidth, start + args.budget):
            print(line, flush=True)
            lines.append(line)
    print(f"done in {time.monotonic() - start:.1f} s", flush=True)
    return lines


if __name__ == "__main__":
    main()

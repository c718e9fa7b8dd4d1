"""The floor of one decode step on this CPU, and where the native engine's step time goes (issue 56).

For a random-init model shape (default SmolLM2-135M: decode time does not depend on the weights' values) at each
dtype and batch, on the fixed workload (``--prompt-len`` random tokens, exactly ``--max-tokens`` new ones, every row
live every step):

- machine: the peak matmul rate (a ``[N, N] @ [N, N]`` matmul, compute bound) and the memory bandwidth (a large
  copy, bytes read + written; and a ``sum``, bytes read), measured in this run at this dtype and thread count;
- floor of one step over ``B`` rows at the average context ``C``: FLOPs ``2 * matmul params * B + 4 * layers *
  heads * head_dim * C * B`` over the peak rate, and bytes ``weight bytes + B * C * KV bytes per token`` over the
  read bandwidth; the step floor is the larger. Beside it, the time the step's matmuls really take here
  (``[B, in]`` through every weight matrix once, weights streamed from memory: rollout.py's ``matmul_seconds``,
  the faster of F.linear and the oneDNN-packed weights the engine uses);
- the engine: its measured ms per step, then one profiled ``generate`` split into matmuls, attention, the other
  torch ops, the C kernels (attention, the fused small ops and the sampler, timed around their ctypes calls) and
  the rest (Python: the scheduler, the block tables, the step's inputs and outputs).

    nice python benchmarks/decode_floor.py --batches 16,64 --dtypes float32,bfloat16 --threads 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as rollout.py: spinning threads on shared cores

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_shapes import random_model  # noqa: E402
from rollout import (StepTimer, add_fixed_workload_args, copy_bandwidth, kv_bytes_per_token,  # noqa: E402
                     matmul_seconds, median_seconds, weight_bytes, weight_matrices)
from rollout_floor import steady_matmul_flops  # noqa: E402

MATMUL_OPS = ("mkldnn::_linear_pointwise", "aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "aten::bmm",
              "mkldnn_linear", "aten::mkldnn_linear")
C_MATMULS = ("bf16_linear", "fp32_linear")  # the decode projections' C kernels (PackedLinear up to 128 rows)
ATTENTION_OPS = ("scaled_dot_product", "_flash_attention", "attention")


def peak_matmul_flops(dtype: torch.dtype, size: int = 2048) -> float:
    return steady_matmul_flops(size, size, size, dtype=dtype)


def read_bandwidth(megabytes: int = 512) -> float:
    buffer = torch.ones(megabytes << 18)
    return buffer.numel() * 4 / median_seconds(buffer.sum, device="cpu", repeats=5)


class KernelClock:
    """Seconds spent inside each C kernel (the engine calls them through ctypes, which the profiler cannot see);
    a context manager: the kernels' modules get their own ``library`` back on exit (a test runs this in-process)."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.saved: dict = {}

    def __enter__(self) -> "KernelClock":
        from hybridflow.rollout import cpu_attention, cpu_fused, cpu_kernels

        real = cpu_kernels.library()
        if real is None:
            return self
        clock = self

        class Timed:
            def __getattr__(self, name):
                function = getattr(real, name)

                def timed(*args):
                    start = time.perf_counter()
                    try:
                        return function(*args)
                    finally:
                        clock.seconds[name] += time.perf_counter() - start
                return timed

        proxy = Timed()
        # cpu_kernels itself too: the decode matmul kernels (bf16_linear / fp32_linear) look the library up there
        self.saved = {module: module.library for module in (cpu_attention, cpu_fused, cpu_kernels)}
        for module in self.saved:
            module.library = lambda: proxy
        return self

    def __exit__(self, *exc) -> None:
        for module, library in self.saved.items():
            module.library = library


def step_floor(model, *, rows: int, context: float, peak: float, bandwidth: float) -> dict[str, float]:
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    params = sum(w.numel() for w in weight_matrices(model))
    flops = 2 * params * rows + 4 * config.num_hidden_layers * config.num_attention_heads * head_dim * context * rows
    moved = weight_bytes(model) + rows * context * kv_bytes_per_token(model)
    return {"flops": flops, "bytes": moved, "compute_s": flops / peak, "memory_s": moved / bandwidth}


def engine_step(model, *, rows: int, prompt_len: int, max_tokens: int, profile: bool):
    """(median seconds of a decode step over all rows, profile split or None) of the native engine on the fixed
    workload."""
    from hybridflow.rollout import SamplingParams
    from hybridflow.rollout.native import NativeEngine

    generator = torch.Generator().manual_seed(rows)
    prompts = torch.randint(model.config.vocab_size, (rows, prompt_len), generator=generator).tolist()
    engine = NativeEngine(model, max_num_seqs=rows, max_model_len=prompt_len + max_tokens)
    params = SamplingParams(n=1, temperature=1.0, max_tokens=max_tokens, ignore_eos=True, seed=0, logprobs=True)
    engine.generate(prompts[:2], SamplingParams(n=1, temperature=1.0, max_tokens=4, ignore_eos=True, seed=0))
    timer = StepTimer(engine)
    engine.generate(prompts, params)
    full = max(live for live, _ in timer.steps)  # every row, unless the engine admitted them in turns
    steps = sorted(seconds for live, seconds in timer.steps[1:] if live == full) or [timer.steps[-1][1]]
    del engine._step  # back to the class's method
    engine.step_clock = None
    per_step = steps[len(steps) // 2]  # the median: robust to another process taking the cores for a while
    if not profile:
        return per_step, None
    with KernelClock() as clock, torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        engine.generate(prompts, params)
        wall = time.perf_counter() - start
    split = defaultdict(float)
    for event in prof.key_averages():
        name, seconds = event.key, event.self_cpu_time_total / 1e6
        if any(op in name for op in MATMUL_OPS):
            split["matmuls (torch)"] += seconds
        elif any(op in name.lower() for op in ATTENTION_OPS):
            split["attention (torch SDPA)"] += seconds
        elif name.startswith("aten::") or name.startswith("mkldnn") or name.startswith("onednn"):
            split["other torch ops"] += seconds
    for name, seconds in clock.seconds.items():
        split[f"matmuls (C {name})" if name in C_MATMULS else f"C {name}"] += seconds
    split["Python and the rest"] = wall - sum(split.values())
    return per_step, {key: value / wall for key, value in split.items()} | {"profiled wall s": wall}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="smollm2-135m")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    add_fixed_workload_args(parser, max_tokens=128)
    parser.add_argument("--no-profile", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    context = args.prompt_len + args.max_tokens / 2
    print(f"{args.shape}, {args.threads} threads, prompt {args.prompt_len} + {args.max_tokens} new tokens "
          f"(average context {context:.0f}); load average {os.getloadavg()[0]:.1f}")
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        peak, copy_bw, read_bw = peak_matmul_flops(dtype), copy_bandwidth("cpu", megabytes=512), read_bandwidth()
        print(f"\n[{dtype_name}] peak matmul {peak / 1e9:.0f} GFLOP/s (2048^3 mm); memory: copy {copy_bw / 1e9:.1f} "
              f"GB/s (read + write), sum {read_bw / 1e9:.1f} GB/s (read)")
        model = random_model(args.shape, dtype=dtype_name, device="cpu")
        print(f"  weights read per step {weight_bytes(model) / 1e6:.0f} MB, KV {kv_bytes_per_token(model)} B a token")
        for rows in (int(b) for b in args.batches.split(",")):
            floor = step_floor(model, rows=rows, context=context, peak=peak, bandwidth=read_bw)
            kernels = {k: matmul_seconds(model, rows=rows, device="cpu", dtype=dtype, kernel=k)
                       for k in ("F.linear", "packed")}
            per_step, split = engine_step(model, rows=rows, prompt_len=args.prompt_len, max_tokens=args.max_tokens,
                                          profile=not args.no_profile)
            bound = max(floor["compute_s"], floor["memory_s"])
            matmuls = min(kernels.values())
            print(f"  batch {rows}: {floor['flops'] / 1e9:.2f} GFLOP and {floor['bytes'] / 1e6:.0f} MB a step -> "
                  f"compute {1e3 * floor['compute_s']:.1f} ms, memory {1e3 * floor['memory_s']:.1f} ms: floor "
                  f"{1e3 * bound:.1f} ms ({rows / bound:.0f} tok/s)")
            print(f"    the step's matmuls measured here: {1e3 * matmuls:.1f} ms (F.linear "
                  f"{1e3 * kernels['F.linear']:.1f}, packed {1e3 * kernels['packed']:.1f}) = "
                  f"{floor['flops'] / matmuls / 1e9:.0f} GFLOP/s (the step's FLOPs over that time); engine {1e3 * per_step:.1f} ms a step "
                  f"({rows / per_step:.0f} tok/s) = {bound / per_step:.0%} of the floor, "
                  f"{matmuls / per_step:.0%} matmuls")
            if split:
                print("    profiled generate: " + ", ".join(
                    f"{key} {value:.0%}" if key != "profiled wall s" else f"{key} {value:.1f}"
                    for key, value in sorted(split.items(), key=lambda kv: -kv[1])))
            sys.stdout.flush()


if __name__ == "__main__":
    main()

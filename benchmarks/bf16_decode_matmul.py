"""A decode step's projections: oneDNN's packed matmul against the AVX-512-BF16 kernel (``--dtype float32``: the
AVX-512F fp32 kernel), in one run (issue 56).

For a model shape (default SmolLM2-135M, random bf16 weights: the time does not depend on their values) the matrices
the native engine multiplies in one decode step, fused as it fuses them (q|k|v, o, gate|up, down per layer, and the
LM head), each multiplied once by ``[M, in]`` rows: weights streamed from memory as a step streams them. Per row
count, the two paths alternate ``--repeats`` times (median of each, wall and process CPU time), beside the floor
of that step on this machine: max(weight bytes / read bandwidth, FLOPs / peak bf16 matmul rate), both measured in
this run.

``--engine-batches``: then the native engine on that random model, its projections on the kernel and on oneDNN (the
kernel turned off while that engine is built), ``--prompt-len`` random prompt tokens and exactly ``--max-tokens`` new
ones a row, the two engines' ``generate`` calls alternating ``--repeats`` times (median tok/s).

    nice python benchmarks/bf16_decode_matmul.py --rows 1,8,16,32,64,128,256 --threads 2 --engine-batches 16,64
    nice python benchmarks/bf16_decode_matmul.py --dtype float32 --rows 1,8,16,24,32,48,64 --threads 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # spinning threads on shared cores

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_floor import peak_matmul_flops, read_bandwidth  # noqa: E402
from model_shapes import SHAPES, random_model  # noqa: E402
from rollout_floor import median_seconds  # noqa: E402

from hybridflow.rollout import bf16_linear, fp32_linear  # noqa: E402
from hybridflow.rollout.packed_linear import _PACKING_BATCH_HINT  # noqa: E402


def fused_shapes(shape: str) -> list[tuple[int, int]]:
    """``(out, in)`` of every matrix one decode step multiplies by, fused as the native engine fuses them."""
    config = SHAPES[shape]
    hidden, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim", hidden // heads)
    layer = [((heads + 2 * kv) * head_dim, hidden), (hidden, heads * head_dim), (2 * inter, hidden), (hidden, inter)]
    return layer * layers + [(config["vocab_size"], hidden)]


KERNELS = {"bfloat16": bf16_linear, "float32": fp32_linear}
"""``--dtype`` -> the kernel's module (``pack``, ``linear``, ``unavailable_reason``)."""


def step_runners(shapes: list[tuple[int, int]], rows: int, dtype: str = "bfloat16"):
    """``{path: one decode step's matmuls}`` over freshly made random weights (each path its own packed copies)."""
    generator = torch.Generator().manual_seed(0)
    module = KERNELS[dtype]
    weights = [torch.randn(n, k, generator=generator).to(getattr(torch, dtype)) for n, k in shapes]
    inputs = {k: torch.randn(rows, k, generator=generator).to(getattr(torch, dtype)) for _, k in shapes}
    onednn = [torch.ops.mkldnn._reorder_linear_weight(w, _PACKING_BATCH_HINT) for w in weights]
    kernel = [module.pack(w) for w in weights]
    del weights

    def run_onednn():
        for (_, k), w in zip(shapes, onednn):
            torch.ops.mkldnn._linear_pointwise(inputs[k], w, None, "none", [], "")

    def run_kernel():
        for (_, k), w in zip(shapes, kernel):
            module.linear(inputs[k], w)

    return {"oneDNN": run_onednn, "kernel": run_kernel}


def engine_tokens_per_second(shape: str, *, batch: int, prompt_len: int, max_tokens: int, repeats: int,
                             dtype: str = "bfloat16"):
    """``{path: median tok/s}`` of the native engine's ``generate`` with the projections on the kernel and on oneDNN."""
    from unittest import mock

    from hybridflow.rollout import SamplingParams
    from hybridflow.rollout.native import NativeEngine

    model = random_model(shape, dtype=dtype, device="cpu")
    engines = {"kernel": NativeEngine(model, max_num_seqs=batch, max_model_len=prompt_len + max_tokens)}
    with mock.patch.object(KERNELS[dtype], "unavailable_reason", lambda: "off for the A/B"):
        engines["oneDNN"] = NativeEngine(model, max_num_seqs=batch, max_model_len=prompt_len + max_tokens)
    assert engines["oneDNN"].decoder.lm_head.path == "oneDNN-packed", engines["oneDNN"].decoder.lm_head.path
    prompts = torch.randint(model.config.vocab_size, (batch, prompt_len), generator=torch.Generator().manual_seed(0))
    params = SamplingParams(n=1, temperature=1.0, max_tokens=max_tokens, ignore_eos=True, seed=0, logprobs=True)
    seconds = {name: [] for name in engines}
    for name, engine in engines.items():  # warm-up
        engine.generate(prompts[:2].tolist(), SamplingParams(n=1, max_tokens=4, ignore_eos=True, seed=0))
    for _ in range(repeats):
        for name, engine in engines.items():
            seconds[name].append(median_seconds(lambda: engine.generate(prompts.tolist(), params), device="cpu",
                                                repeats=1))
    return {name: batch * max_tokens / sorted(t)[len(t) // 2] for name, t in seconds.items()}


def clocked(work) -> tuple[float, float]:
    """(wall, process CPU) seconds of one ``work()``: CPU time leaves out the time another process held the cores
    (it counts memory stalls), the steadier A/B on a shared machine."""
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - wall, time.process_time() - cpu


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    parser.add_argument("--rows", default="1,8,16,32,64,128,256")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(KERNELS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--engine-batches", default="", help="also the native engine A/B at these batches")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    reason = KERNELS[args.dtype].unavailable_reason()
    if reason is not None:
        raise SystemExit(f"the {args.dtype} kernel does not run here: {reason}")
    shapes = fused_shapes(args.shape)
    params = sum(n * k for n, k in shapes)
    size = getattr(torch, args.dtype).itemsize
    peak, bandwidth = peak_matmul_flops(getattr(torch, args.dtype)), read_bandwidth()
    print(f"{args.shape}: {params / 1e6:.1f} M matmul params ({size * params / 1e6:.0f} MB {args.dtype}), "
          f"{args.threads} threads; {args.dtype} peak {peak / 1e9:.0f} GFLOP/s ([2048]^2 mm), read bandwidth "
          f"{bandwidth / 1e9:.1f} GB/s")
    print("rows | floor ms | oneDNN ms  GFLOP/s  GB/s  cpu ms | kernel ms  GFLOP/s  GB/s  cpu ms | oneDNN / kernel "
          "(wall, cpu)")
    with torch.no_grad():
        for rows in (int(r) for r in args.rows.split(",")):
            runners = step_runners(shapes, rows, args.dtype)
            wall, cpu = ({name: [] for name in runners} for _ in range(2))
            for _ in range(args.repeats):  # interleaved: the machine's load hits both alike
                for name, run in runners.items():
                    seconds = clocked(run)
                    wall[name].append(seconds[0]), cpu[name].append(seconds[1])
            flops, floor = 2 * params * rows, max(size * params / bandwidth, 2 * params * rows / peak)
            wall, cpu = ({name: median(t) for name, t in d.items()} for d in (wall, cpu))
            cells = [f"{wall[n] * 1e3:9.1f} {flops / wall[n] / 1e9:8.0f} {size * params / wall[n] / 1e9:5.1f} "
                     f"{cpu[n] * 1e3:7.1f}" for n in runners]
            print(f"{rows:4d} | {floor * 1e3:8.1f} | {cells[0]} | {cells[1]} | {wall['oneDNN'] / wall['kernel']:.2f}x, "
                  f"{cpu['oneDNN'] / cpu['kernel']:.2f}x", flush=True)
    for batch in (int(b) for b in args.engine_batches.split(",") if b):
        rates = engine_tokens_per_second(args.shape, batch=batch, prompt_len=args.prompt_len,
                                         max_tokens=args.max_tokens, repeats=args.repeats, dtype=args.dtype)
        print(f"native engine, batch {batch}, {args.prompt_len} + {args.max_tokens} tokens: kernel "
              f"{rates['kernel']:.1f} tok/s, oneDNN {rates['oneDNN']:.1f} tok/s, "
              f"{rates['kernel'] / rates['oneDNN']:.2f}x",
              flush=True)


if __name__ == "__main__":
    main()

"""One routed-experts layer of a real MoE's shape at decode batch sizes: the Triton grouped experts against the eager
torch path and the bytes floor (issue 46).

For each row count (tokens of one decode step), random hidden states through a random router of ``--shape``'s experts
(Qwen3-30B-A3B by default: hidden 2048, 128 experts of moe_intermediate 768, top-8, bf16), timed three ways:

- ``triton``: what :func:`hybridflow.rollout.moe.moe_mlp` runs with ``graph_safe=True`` on CUDA (routing, the
  device-side alignment and the two grouped GEMMs of :mod:`hybridflow.rollout.triton_moe`, with each ``--tiles``),
  captured in a CUDA graph and replayed, as a decode step runs it;
- ``eager``: ``graph_safe=False``, :func:`hybridflow.rollout.moe.grouped_experts` (one host sync, a loop over the
  used experts: what the engine ran outside graphs);
- ``floor``: the used experts' weight bytes (``3 I hidden`` elements each) over the device's copy bandwidth, measured
  in the same run (a large ``copy_``: bytes read + written over its time). ``triton / floor`` is the printed ratio;
- ``align``: the part of ``triton`` that groups the pairs by expert (:func:`hybridflow.rollout.triton_moe.align_pairs`,
  about twenty small torch ops, also replayed from a graph): the fixed cost a smaller step cannot hide.

The layer's weights (1.2 GB at the default shape) are far larger than L2, but the same layer is replayed, so at the
smallest row counts part of the used experts may be served from L2 (a real step reads 48 layers in turn).
The Triton output is checked against the eager one each row count (relative error printed; over 2 % exits non-zero).

    python benchmarks/moe_experts.py                          # CUDA, under 30 s on an H100 / H200
    python benchmarks/moe_experts.py --rows 1,8,64 --iters 50 --tiles 64x64,32x128,128x64
    python benchmarks/moe_experts.py --smoke                  # CPU: a tiny layer through Triton's interpreter
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # hybridflow, run from anywhere
sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_shapes import SHAPES  # noqa: E402
from rollout import copy_bandwidth  # noqa: E402 -- the same copy as the engine benchmark's roofline


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen3-30b-a3b", help="an MoE shape of benchmarks/model_shapes.py")
    parser.add_argument("--rows", default="1,2,4,8,16,32,64,128,256", help="decode rows (tokens), comma-separated")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--iters", type=int, default=20, help="timed calls per path and row count")
    parser.add_argument("--tiles", default="64x64",
                        help="the grouped GEMMs' BLOCK_N x BLOCK_K, comma-separated to compare (e.g. 64x64,32x128)")
    parser.add_argument("--smoke", action="store_true",
                        help="CPU: tiny-qwen3-moe, rows 1 and 5, fp32, one call each, Triton interpreted")
    args = parser.parse_args(argv)
    if args.smoke:
        args.shape, args.rows, args.dtype, args.iters = "tiny-qwen3-moe", "1,5", "float32", 1
    return args


def expert_shape(shape: str) -> dict:
    """``hidden``, ``experts``, ``intermediate``, ``top_k`` and ``renormalize`` of an MoE shape."""
    fields = SHAPES.get(shape)
    if fields is None or "moe_intermediate_size" not in fields and "num_local_experts" not in fields:
        moe = [name for name, f in SHAPES.items() if "num_experts" in f or "num_local_experts" in f]
        raise SystemExit(f"--shape {shape!r} is no MoE shape; choose one of {', '.join(moe)}")
    qwen = "num_experts" in fields
    return dict(hidden=fields["hidden_size"], experts=fields["num_experts" if qwen else "num_local_experts"],
                intermediate=fields["moe_intermediate_size" if qwen else "intermediate_size"],
                top_k=fields["num_experts_per_tok"], renormalize=fields.get("norm_topk_prob", True) if qwen else True,
                qwen=qwen)


def random_layer(shape: dict, *, dtype: torch.dtype, device: str):
    from hybridflow.rollout.moe import ExpertWeights

    generator = torch.Generator(device=device).manual_seed(0)
    hidden, experts, intermediate = shape["hidden"], shape["experts"], shape["intermediate"]

    def weights(*size, scale):
        return (torch.randn(*size, generator=generator, device=device, dtype=torch.float32) * scale).to(dtype)

    layer = ExpertWeights(router=weights(experts, hidden, scale=hidden**-0.5),
                          gate_up=weights(experts, 2 * intermediate, hidden, scale=hidden**-0.5),
                          down=weights(experts, hidden, intermediate, scale=intermediate**-0.5),
                          top_k=shape["top_k"], renormalize=shape["renormalize"],
                          weights_in_activation_dtype=shape["qwen"])
    layer.triton_grouped = True  # on CPU (--smoke): the kernels through Triton's interpreter
    return layer


def timed(call, *, device: str, iters: int) -> float:
    """Seconds per ``call()`` (after one untimed call)."""
    call()
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(iters):
            call()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    began = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - began) / iters


def graph_replay(step, device: str):
    """``step`` captured in a CUDA graph (after a warm-up call that compiles the kernels): its replay; on CPU,
    ``step`` itself."""
    if device != "cuda":
        return step
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def measure(layer, rows: int, *, tiles: list[tuple[int, int]], device: str, iters: int, bandwidth: float
            ) -> list[dict]:
    """One row count: the floor, the alignment and the eager path once, the Triton path once per tile shape."""
    from hybridflow.rollout.moe import moe_mlp, route
    from hybridflow.rollout.triton_moe import align_pairs, block_m_for, grouped_swiglu_experts

    generator = torch.Generator(device=device).manual_seed(rows)
    x = torch.randn(rows, layer.router.shape[1], generator=generator, device=device).to(layer.router.dtype)
    experts = layer.gate_up.shape[0]
    eager = {}
    eager_s = timed(lambda: eager.__setitem__("out", moe_mlp(x, layer, F.silu)), device=device, iters=iters)
    ids = route(x, layer)[1]
    align_s = timed(graph_replay(lambda: align_pairs(ids, experts, block_m_for(ids.numel(), experts)), device),
                    device=device, iters=iters)
    used = int(ids.unique().numel())
    expert_bytes = (layer.gate_up[0].numel() + layer.down[0].numel()) * layer.gate_up.element_size()
    floor_s = used * expert_bytes / bandwidth
    results = []
    for block_n, block_k in tiles:
        out = {}

        def triton_step():  # moe_mlp's graph-safe CUDA path, with these tiles
            weights, ids = route(x, layer)
            out["y"] = grouped_swiglu_experts(x, weights, ids, layer.gate_up, layer.down, block_n=block_n,
                                              block_k=block_k)

        triton_s = timed(graph_replay(triton_step, device), device=device, iters=iters)
        error = float((out["y"].float() - eager["out"].float()).norm() / eager["out"].float().norm())
        results.append(dict(rows=rows, tiles=f"{block_n}x{block_k}", used=used, floor_us=floor_s * 1e6,
                            triton_us=triton_s * 1e6, align_us=align_s * 1e6, eager_us=eager_s * 1e6,
                            ratio=triton_s / floor_s, error=error))
    return results


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported
    elif not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --smoke for the CPU check through Triton's interpreter")
    tiles = [tuple(int(edge) for edge in tile.split("x")) for tile in args.tiles.split(",")]
    shape = expert_shape(args.shape)
    layer = random_layer(shape, dtype=getattr(torch, args.dtype), device=device)
    bandwidth = copy_bandwidth(device, megabytes=1024 if device == "cuda" else 64)
    print(f"{args.shape}: hidden {shape['hidden']}, {shape['experts']} experts of {shape['intermediate']}, "
          f"top-{shape['top_k']}, {args.dtype}, {device}; copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    print("| rows | tiles n x k | experts used | floor us | triton us | triton / floor | align us | eager us "
          "| eager / triton | rel. error |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    results = []
    for rows in (int(r) for r in args.rows.split(",")):
        for r in measure(layer, rows, tiles=tiles, device=device, iters=args.iters, bandwidth=bandwidth):
            results.append(r)
            print(f"| {rows} | {r['tiles']} | {r['used']} | {r['floor_us']:.1f} | {r['triton_us']:.1f} | "
                  f"{r['ratio']:.2f} | {r['align_us']:.1f} | {r['eager_us']:.1f} | {r['eager_us'] / r['triton_us']:.2f} "
                  f"| {r['error']:.1e} |", flush=True)
    worst = max(r["error"] for r in results)
    if worst > 2e-2:
        raise SystemExit(f"the Triton experts differ from grouped_experts by {worst:.1e} (relative): a kernel bug")
    return results


if __name__ == "__main__":
    main()

"""A mixture-of-experts model's rollout on CPU: the native engine with the C expert kernel, the same engine with its
experts as torch ops (the path before the kernel), and HF ``generate``, interleaved round by round (issue 58); with
``--engines native,hf`` any model of the table (OLMo 2 / 3 too): the native engine against the HF fallback.

The fixed workload of ``benchmarks/rollout.py`` (``--batches`` rows of ``--prompt-len`` random tokens, exactly
``--max-tokens`` new tokens each, temperature 1), run ``--rounds`` times; each round runs the three engines in a
rotated order. On a shared machine the wall clock measures the other sessions as much as the engines, so beside it
each run's process CPU time is printed (user + system of every thread, what the run itself computed), and the
medians over the rounds of both.

    python benchmarks/moe_decode.py --shape tiny-gpt-oss --batches 16,64 --rounds 3
    python benchmarks/moe_decode.py --model-path /tmp/glm --batches 16,64   # a saved model (mla_cache.py writes one)
    python benchmarks/moe_decode.py --shape tiny-olmo2 --engines native,hf
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as benchmarks/rollout.py: sleeping OpenMP threads

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from rollout import add_fixed_workload_args, run_hf, run_native, synthetic_requests  # noqa: E402

ENGINES = ("native", "native-torch-experts", "hf")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--shape", help="a shape of benchmarks/model_shapes.py (random weights)")
    source.add_argument("--model-path", help="a saved HF folder")
    add_fixed_workload_args(parser, max_tokens=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"some of {', '.join(ENGINES)}, hf last")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.workload = "fixed"
    args.engines = tuple(args.engines.split(","))
    if set(args.engines) - set(ENGINES) or args.engines[-1] != "hf":
        parser.error(f"--engines takes some of {', '.join(ENGINES)}, ending with hf (the ratios are against it)")
    return args


def load(args):
    if args.shape:
        from model_shapes import random_model

        return random_model(args.shape, dtype="float32", device="cpu")
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(args.model_path, dtype=torch.float32).eval()


def without_expert_kernel(engine):
    """The engine's sparse layers on the torch path (:func:`hybridflow.rollout.moe.grouped_experts`, and GLM's /
    DeepSeek-V3's shared MLP as HF's module)."""
    decoder = engine.decoder
    sparse = [getattr(layer, name, None) for layer in getattr(decoder, "layers", []) for name in ("experts",
                                                                                                "grouped_moe")]
    for moe in [m for m in sparse + list(getattr(decoder, "experts", [])) if m is not None]:  # MLA's: .experts
        inner = getattr(moe, "experts", moe)  # a GroupedMoE holds its routed ExpertWeights
        inner.cpu_kernel = None
        if inner is not moe:
            moe.with_shared = None
    return engine


def one_run(name: str, model, requests) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one engine's generate call over ``requests``."""
    from hybridflow.rollout.native import NativeEngine

    max_len = max(len(r.prompt) + r.max_tokens for r in requests)
    cpu = time.process_time()
    if name == "hf":
        wall = run_hf(model, requests, 1.0, static=False)
    else:
        engine = NativeEngine(model, max_num_seqs=len(requests), max_model_len=max_len)
        wall = run_native(without_expert_kernel(engine) if name.endswith("torch-experts") else engine, requests, 1.0)
    return wall, time.process_time() - cpu


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load(args)
    print(f"{args.shape or args.model_path}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
          f"{args.threads} threads, load average {os.getloadavg()[0]:.1f} at start")
    for batch in [int(b) for b in args.batches.split(",")]:
        requests = synthetic_requests(args, batch=batch, vocab_size=model.config.vocab_size)
        tokens = sum(r.max_tokens for r in requests)
        engines = args.engines
        runs = {name: [] for name in engines}
        for round_ in range(args.rounds):
            turn = round_ % len(engines)
            for name in engines[turn:] + engines[:turn]:
                wall, cpu = one_run(name, model, requests)
                runs[name].append((wall, cpu))
                print(f"batch {batch} round {round_} {name}: {tokens / wall:.0f} tok/s wall, {tokens / cpu:.0f} "
                      f"tok/CPU-s (load {os.getloadavg()[0]:.1f})", flush=True)
        wall = {n: statistics.median(w for w, _ in r) for n, r in runs.items()}
        cpu = {n: statistics.median(c for _, c in r) for n, r in runs.items()}
        print(f"| {batch} | " + " | ".join(f"{tokens / wall[n]:.0f} / {tokens / cpu[n]:.0f}" for n in engines)
              + "".join(f" | {wall['hf'] / wall[n]:.2f}x / {cpu['hf'] / cpu[n]:.2f}x" for n in engines[:-1]) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Rollout throughput: the native engine vs HF generate (and vLLM when installed).

RL-shaped workload: chat-templated arithmetic prompts, ``n`` samples per prompt at
temperature 1 with EOS, so response lengths vary as they do in GRPO/PPO rollouts.
Throughput counts useful tokens (each response up to and including its EOS) per
second of wall time, engine construction excluded, everything else (prefill, cache
allocation, sampling) included.

The floor: a decode step must at least do the matmuls, so with
``F = 2 * (matmul params) + 4 * layers * heads * head_dim * avg_context`` FLOPs per
token and ``R`` the measured matmul rate of this machine (same dtype, same threads,
every weight matrix of the model once at the batch size, as a decode step does), no
engine can beat ``R / F`` tokens/s. ``R`` is measured twice: with plain ``F.linear`` and
with the weights packed once for oneDNN (what the native engine does on CPU; the faster,
so the stricter floor).

    python benchmarks/rollout.py                 # CPU, fp32, 2 threads, batch 16/64/128
    python benchmarks/rollout.py --quick         # batch 16/64, 64 new tokens
    python benchmarks/rollout.py --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import time
from dataclasses import dataclass

# The cores are shared: OpenMP threads that spin at barriers while a sibling is descheduled
# make small decode matmuls 10-25x slower (measured here); sleeping threads do not. Must be
# set before torch loads libgomp. Both engines run under the same setting.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


@dataclass
class EngineRun:
    engine: str
    batch: int
    tokens: int
    seconds: float
    mean_length: float
    avg_context: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default=None, help="HF folder; default: the fetched SmolLM2-135M-Instruct")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", default="16,64,128", help="sequences per generate call (prompts x n)")
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--engines", default="native,hf,vllm")
    parser.add_argument("--quick", action="store_true", help="batch 16/64 and 64 new tokens")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.quick:
        args.batches, args.max_tokens = "16,64", 64
    return args


def machine_description(args) -> str:
    cpu = platform.processor() or platform.machine()
    if os.path.exists("/proc/cpuinfo"):
        names = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")]
        cpu = names[0] if names else cpu
    load = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    lines = [f"cpu: {cpu}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}, load avg {load}",
             f"torch {torch.__version__}, device {args.device}, dtype {args.dtype}, "
             f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}"]
    if args.device.startswith("cuda"):
        lines.append(f"gpu: {torch.cuda.get_device_name()}")
    return "\n".join(lines)


def arithmetic_prompts(tokenizer, count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        a, b, op = rng.randint(2, 99), rng.randint(2, 99), rng.choice("+-*")
        question = f"What is {a} {op} {b}? Reply with only the final answer."
        ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                            return_dict=True)["input_ids"]
        prompts.append(list(ids))
    return prompts


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


MATMUL_KERNELS = ("F.linear", "packed")
"""How :func:`matmul_rate` multiplies: plain ``F.linear``, or the weights packed once for
oneDNN as the native engine multiplies on CPU (``PackedLinear``; same as ``F.linear`` elsewhere)."""


def matmul_rate(model, *, batch: int, device: str, dtype: torch.dtype, kernel: str = "F.linear",
                repeats: int = 5) -> float:
    """FLOP/s of ``[batch, in] x [in, out]`` through every weight matrix of the model once (median of runs).

    This is the matmul work of one decode step with the weights streamed from memory as a
    step streams them; a single matrix multiplied repeatedly would stay in cache and
    overstate what a decode step can reach at small batch.
    """
    from hybridflow.rollout.packed_linear import PackedLinear

    weights = [w for w in model.parameters() if w.dim() == 2 and w is not model.get_input_embeddings().weight]
    weights.append(model.get_output_embeddings().weight)
    inputs = {w.shape[1]: torch.randn(batch, w.shape[1], device=device, dtype=dtype) for w in weights}
    flops = sum(2 * batch * w.numel() for w in weights)
    layers = [PackedLinear(w) if kernel == "packed" else (lambda x, w=w: F.linear(x, w)) for w in weights]
    times = []
    with torch.no_grad():
        for _ in range(repeats + 1):
            synchronize(device)
            start = time.perf_counter()
            for w, layer in zip(weights, layers):
                layer(inputs[w.shape[1]])
            synchronize(device)
            times.append(time.perf_counter() - start)
    return flops / sorted(times[1:])[len(times[1:]) // 2]


def flops_per_token(model, avg_context: float) -> float:
    """2 x (weights used by matmuls, LM head included) + attention's QK^T and PV over the context."""
    config = model.config
    embedding = model.get_input_embeddings().weight.numel()
    matmul_params = sum(p.numel() for p in model.parameters() if p.dim() == 2) - embedding
    if config.tie_word_embeddings:
        matmul_params += embedding  # the tied LM head is a matmul with the embedding
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    attention = 4 * config.num_hidden_layers * config.num_attention_heads * head_dim * avg_context
    return 2 * matmul_params + attention


def run_engine(name, engine, prompts, params, batch) -> EngineRun:
    from hybridflow.rollout import SamplingParams

    warm = SamplingParams(n=1, temperature=1.0, max_tokens=4, seed=1, stop_token_ids=params.stop_token_ids)
    engine.generate(prompts[:1], warm)  # first-call allocations and lazy init are not the steady state
    device = "cuda" if torch.cuda.is_available() else "cpu"
    synchronize(device)
    start = time.perf_counter()
    completions = engine.generate(prompts, params)
    synchronize(device)
    seconds = time.perf_counter() - start
    lengths = [len(c.token_ids) for c in completions]
    positions = [len(prompts[c.prompt_index]) + t for c in completions for t in range(len(c.token_ids))]
    return EngineRun(name, batch, sum(lengths), seconds, sum(lengths) / len(lengths), sum(positions) / len(positions))


def build_engines(names, model, tokenizer, model_path):
    from hybridflow.rollout import build_engine
    from hybridflow.rollout.vllm import vllm_available

    engines = {}
    for name in names:
        if name == "vllm" and not vllm_available():
            print("vllm: not installed, skipped")
            continue
        kwargs = {"model_path": model_path} if name == "vllm" else {}
        engines[name] = build_engine(name, model, tokenizer, **kwargs)
    return engines


def main() -> None:
    from hybridflow.models import fetch_default_model, load_causal_lm, load_tokenizer
    from hybridflow.rollout import SamplingParams

    args = parse_args()
    torch.set_num_threads(args.threads)
    model_path = args.model_path or fetch_default_model()
    dtype = getattr(torch, args.dtype)
    model = load_causal_lm(model_path, dtype=args.dtype).to(args.device).eval().requires_grad_(False)
    tokenizer = load_tokenizer(model_path)
    print(machine_description(args))
    print(f"model: {model_path} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params)")
    engines = build_engines(args.engines.split(","), model, tokenizer, model_path)
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        prompts = arithmetic_prompts(tokenizer, batch // args.n, seed=args.seed + batch)
        params = SamplingParams(n=args.n, temperature=1.0, max_tokens=args.max_tokens,
                                stop_token_ids=[tokenizer.eos_token_id], seed=args.seed)
        runs = {name: run_engine(name, engine, prompts, params, batch) for name, engine in engines.items()}
        rates = {kernel: matmul_rate(model, batch=batch, device=args.device, dtype=dtype, kernel=kernel)
                 for kernel in MATMUL_KERNELS}
        rows.append((batch, runs, rates))
        report_batch(batch, runs, rates, model)
    print_table(rows, model)


def report_batch(batch, runs, rates, model) -> None:
    for run in runs.values():
        print(f"batch {batch:4d} {run.engine:>6}: {run.tokens:6d} tokens in {run.seconds:7.1f} s = "
              f"{run.tokens_per_s:8.1f} tok/s (mean response {run.mean_length:.0f} tokens)")
    if "native" in runs:
        native = runs["native"]
        for name, run in runs.items():
            if name != "native":
                print(f"batch {batch:4d} native / {name}: {native.tokens_per_s / run.tokens_per_s:.2f}x")
        flops = flops_per_token(model, native.avg_context)
        for kernel, rate in rates.items():
            floor = rate / flops
            print(f"batch {batch:4d} floor ({kernel}): {rate / 1e9:.1f} GFLOP/s / {flops / 1e6:.0f} MFLOP per token "
                  f"= {floor:.1f} tok/s; native at {100 * native.tokens_per_s / floor:.0f} % of it")
    print(f"batch {batch:4d} load avg {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)


def print_table(rows, model) -> None:
    names = list(rows[0][1])
    floors = " | ".join(f"floor tok/s ({k} R) | native % of it" for k in MATMUL_KERNELS)
    print("\n| batch | " + " | ".join(f"{n} tok/s" for n in names) + f" | native / hf | {floors} |")
    print("|---" * (len(names) + 2 + 2 * len(MATMUL_KERNELS)) + "|")
    for batch, runs, rates in rows:
        native = runs.get("native")
        ratio = native.tokens_per_s / runs["hf"].tokens_per_s if native and "hf" in runs else float("nan")
        cells = [f"{runs[n].tokens_per_s:.1f}" for n in names] + [f"{ratio:.2f}x"]
        for rate in rates.values():
            floor = rate / flops_per_token(model, native.avg_context) if native else float("nan")
            pct = 100 * native.tokens_per_s / floor if native else float("nan")
            cells += [f"{floor:.1f} ({rate / 1e9:.1f} GFLOP/s)", f"{pct:.0f} %"]
        print(f"| {batch} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

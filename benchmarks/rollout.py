"""Rollout throughput: the native engine vs HF generate (and vLLM when installed).

RL-shaped workload: chat-templated arithmetic prompts, ``n`` samples per prompt at
temperature 1 with EOS, so response lengths vary as they do in GRPO/PPO rollouts.
Throughput counts useful tokens (each response up to and including its EOS) per
second of wall time, engine construction excluded, everything else (prefill, cache
allocation, sampling) included.

Two floors, both from matmul rates measured in the same run (fp32, same threads, every
weight matrix of the model once per "step", streamed from memory as a decode step streams
it; the faster of plain ``F.linear`` and the oneDNN-packed weights the engine uses):

- flat floor: ``R / F`` tokens/s, with ``F = 2 * (matmul params) + 4 * layers * heads *
  head_dim * avg_context`` FLOPs per token and ``R`` the matmul rate at the full batch's
  row count. It prices every token as if every decode step were full.
- step floor: the decode steps the workload really needs. With EOS, response lengths
  vary (most end by ~60 tokens, the longest runs to 256), so a synchronous ``generate``
  runs ``max(length) - 1`` steps whose live row count falls from the batch to 1; a step
  with few rows still reads every weight, so it costs about what a full one does. The
  step floor sums the measured matmul time at each step's live row count (plus each
  prompt's prefill), so it is what the matmuls alone take for this workload at this
  machine's rates; attention is added at the same rate.

    python benchmarks/rollout.py                 # CPU, fp32, 2 threads, batch 16/64/128
    python benchmarks/rollout.py --quick         # batch 16/64, 64 new tokens
    python benchmarks/rollout.py --device cuda --dtype bfloat16

Random-init models shaped like real ones (``--shape``, config only, no download; EOS ignored,
since a random model does not stop like a trained one), on two synthetic workloads, engines
``native``, ``hf`` (HF ``generate``) and ``hf-static`` (HF ``generate`` with a static cache and
``torch.compile``), each reported against the memory roofline: the bytes the workload must read
(every weight once per decode step, each row's cached keys and values once per token) over the
copy bandwidth measured in the same run:

- ``--workload fixed``: ``--batches`` rows of ``--prompt-len`` random tokens, exactly
  ``--max-tokens`` new tokens each (every engine runs the same steps);
- ``--workload nano-vllm``: nano-vllm's benchmark, 256 requests with prompt and output lengths
  drawn from 100-1024 (``random.seed(0)``), temperature 0.6, EOS ignored.

    python benchmarks/rollout.py --device cuda --dtype bfloat16 --shape qwen3-0.6b --workload nano-vllm
    python benchmarks/rollout.py --device cuda --dtype bfloat16 --shape smollm2-135m --workload fixed \
        --batches 16,64,256 --engines native,hf,hf-static
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from dataclasses import dataclass, replace

# The cores are shared: OpenMP threads that spin at barriers while a sibling is descheduled
# make small decode matmuls 10-25x slower (measured here); sleeping threads do not. Must be
# set before torch loads libgomp. Both engines run under the same setting.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from hybridflow.cpu import describe_cpu  # noqa: E402
from hybridflow.rollout.packed_linear import kernel_path  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling rollout_floor, also when loaded by path
from rollout_floor import (  # noqa: E402,F401 -- re-exported: sibling benchmarks import these from rollout
    MATMUL_KERNELS, ROW_GRID, Floors, copy_bandwidth, decode_rows_per_step, fastest, floors_for, flops_per_token,
    interpolate, kv_bytes_per_token, matmul_curve, matmul_seconds, median_seconds, roofline_bytes,
    step_floor_seconds, synchronize, weight_bytes, weight_flops_per_token, weight_matrices, weight_stream_seconds,
)


@dataclass
class EngineRun:
    engine: str
    batch: int
    seconds: float
    lengths: list[int]
    """Each response's useful tokens (up to and including its EOS)."""
    prompt_lengths: list[int]
    avg_context: float
    ttft: float = float("nan")
    """Time to first token: the same call with ``max_tokens=1`` (every prompt prefilled, its first token sampled)."""

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def mean_length(self) -> float:
        return self.tokens / len(self.lengths)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default=None, help="HF folder; default: the fetched SmolLM2-135M-Instruct")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", default="16,64,128", help="sequences per generate call (prompts x n)")
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--engines", default="native,hf,vllm",
                        help="any of native, hf, vllm (at --dtype), vllm-auto (vLLM's dtype=auto: bf16 on a CPU), "
                             "native-nolanes (the native engine without decode lanes), "
                             "native-sync / native-overlap (overlap_steps off / on: the default is on with the CUDA "
                             "kernels, off on CPU; native,native-sync measures both in one run), "
                             "native-mirror (CPU: SDPA over the slot mirror instead of the paged kernel) and "
                             "native-unfused (CPU: the layer's small ops and the sampler as torch ops, attention still "
                             "the kernel)")
    parser.add_argument("--step-times", action="store_true",
                        help="time every native decode step and print the mean by live-row bucket, and the host gap "
                             "per step (a step's readback to the next launch) and the readback's wait")
    parser.add_argument("--quick", action="store_true", help="batch 16/64 and 64 new tokens")
    parser.add_argument("--requests-per-slot", type=int, default=1,
                        help="sequences per call = batch x this; the native engine keeps `batch` slots full by "
                             "continuous batching, HF generate runs the sequences `batch` at a time")
    parser.add_argument("--shape", default=None,
                        help="random-init model of this shape (benchmarks/model_shapes.py) on a synthetic workload")
    parser.add_argument("--workload", default="fixed", choices=["fixed", "nano-vllm"],
                        help="with --shape: fixed-length rows, or nano-vllm's 256 requests of 100-1024 tokens")
    parser.add_argument("--prompt-len", type=int, default=128, help="--workload fixed: prompt tokens per row")
    parser.add_argument("--enforce-eager", action="store_true", help="native engine without CUDA graphs")
    parser.add_argument("--num-kv-blocks", type=int, default=None,
                        help="--shape runs: the native engine's KV blocks (16 positions each); fewer than the workload "
                             "holds at once forces preemption and recompute")
    parser.add_argument("--max-num-batched-tokens", type=int, default=None,
                        help="--shape runs: chunked prefill within this many tokens a step (verl's default is 8192, "
                             "chunking on); unset: whole prompts, as nano-vllm prefills them")
    parser.add_argument("--profile-admission", action="store_true",
                        help="with --shape on CUDA: profile admitting every request (prefill + first token) alone")
    parser.add_argument("--breakdown", action="store_true",
                        help="with --shape on CUDA: time one decode step's graph, its attention and the sampling")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.batches, args.max_tokens = "16,64", 64
    return args


def machine_description(args) -> str:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    dtype = getattr(torch, args.dtype)
    lines = [f"cpu: {describe_cpu()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}, "
             f"load avg {load}",
             f"torch {torch.__version__}, device {args.device}, dtype {args.dtype}, "
             f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}",
             f"engine projections: {kernel_path(dtype, args.device)}"]
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


def warm_up(engine, prompts, params) -> None:
    """First-call allocations and lazy initialisation are not the steady state."""
    from hybridflow.rollout import SamplingParams

    engine.generate(prompts[:1], SamplingParams(n=1, temperature=1.0, max_tokens=4, seed=1,
                                                stop_token_ids=params.stop_token_ids))


def timed_generate(engine, prompts, params, chunk: int) -> tuple[float, list]:
    """Seconds of ``generate`` over ``prompts``, ``chunk`` at a time, and the completions."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    synchronize(device)
    start = time.perf_counter()
    completions = []
    for first in range(0, len(prompts), chunk):
        part = engine.generate(prompts[first : first + chunk], params)
        completions += [replace(c, prompt_index=c.prompt_index + first) for c in part]
    synchronize(device)
    return time.perf_counter() - start, completions


def run_engine(name, engine, prompts, params, batch, chunk: int | None = None) -> EngineRun:
    """One timed ``generate`` call (after :func:`warm_up`), or one per ``chunk`` prompts; then the time to first
    token, the same call cut at one token (the batch's prefill and first sampled token: the last row's TTFT)."""
    chunk = chunk or len(prompts)
    seconds, completions = timed_generate(engine, prompts, params, chunk)
    ttft, _ = timed_generate(engine, prompts, replace(params, max_tokens=1), chunk)
    lengths = [len(c.token_ids) for c in completions]
    positions = [len(prompts[c.prompt_index]) + t for c in completions for t in range(len(c.token_ids))]
    return EngineRun(name, batch, seconds, lengths, [len(p) for p in prompts], sum(positions) / len(positions), ttft)


def build_engines(names, model, tokenizer, model_path):
    from hybridflow.rollout import build_engine
    from hybridflow.rollout.vllm import vllm_available

    engines = {}
    for name in names:
        if name.startswith("vllm") and not vllm_available():
            print(f"{name}: vLLM not importable and its side venv may not be made (HYBRIDFLOW_VLLM_SIDE_VENV=0), skipped")
            continue
        if name in ("vllm", "vllm-auto"):  # vllm: the model's dtype, as the native engine; vllm-auto: vLLM's default
            dtype = "auto" if name == "vllm-auto" else str(model.dtype).replace("torch.", "")
            # 64 sequences of 512 positions: the KV cache the workload needs (vLLM CPU would reserve half the memory)
            engines[name] = build_engine("vllm", model, tokenizer, model_path=model_path, dtype=dtype,
                                         max_model_len=512, max_num_seqs=64)
            continue
        if name == "native-nolanes":
            from hybridflow.rollout.native import NativeEngine

            engines[name] = NativeEngine(model, tokenizer, decode_lanes=False)
            continue
        if name in ("native-sync", "native-overlap"):
            engines[name] = build_engine("native", model, tokenizer, overlap_steps=OVERLAP[name])
            continue
        if name == "native-mirror":  # CPU: SDPA over the slot mirror, as where the paged kernel is not built
            engines[name] = build_engine("native", model, tokenizer)
            engines[name].decoder.paged_cpu_attention = False
            continue
        if name == "native-unfused":  # CPU: the decode step before the fused C kernels, beside them
            engines[name] = build_engine("native", model, tokenizer)
            engines[name].decoder.fused_cpu_decode = False
            engines[name].generate = with_torch_sampling(engines[name].generate)
            continue
        kwargs = {"model_path": model_path} if name == "vllm" else {}
        engines[name] = build_engine(name, model, tokenizer, **kwargs)
    return engines


OVERLAP = {"native": None, "native-sync": False, "native-overlap": True}
"""The native engine's ``overlap_steps`` by engine name (None: its default)."""


def with_torch_sampling(generate):
    """``generate`` with the one-pass CPU sampling kernel switched off for the call (the torch ops sample)."""
    from hybridflow.rollout import sampler

    def call(*args, **kwargs):
        state = sampler._FUSED_SAMPLING["cpu"]
        enabled, state["enabled"] = state["enabled"], False
        try:
            return generate(*args, **kwargs)
        finally:
            state["enabled"] = enabled

    return call


class StepTimer:
    """Wraps a native engine's decode step and records ``(live rows, seconds)`` per step, and gives the engine a
    :class:`~hybridflow.rollout.generation_run.StepClock` (host gap and readback wait per step); unwraps on report."""

    def __init__(self, engine):
        from hybridflow.rollout.generation_run import StepClock

        self.engine = engine
        self.steps: list[tuple[int, float]] = []
        self.clock = engine.step_clock = StepClock()
        step = engine._step

        def timed(run):
            rows, start = len(run.live), time.perf_counter()
            step(run)
            self.steps.append((rows, time.perf_counter() - start))

        engine._step = timed

    def report(self, label: str) -> None:
        buckets: dict[int, list[float]] = {}
        for rows, seconds in self.steps:
            buckets.setdefault(1 << (rows.bit_length() - 1), []).append(seconds)
        print(f"{label} step times: " + "; ".join(
            f"{low}-{2 * low - 1} rows: {len(times)} x {1e3 * sum(times) / len(times):.1f} ms"
            for low, times in sorted(buckets.items())) + f"; steps total {sum(s for _, s in self.steps):.2f} s")
        clock = self.clock
        if clock.gaps:
            print(f"{label} host gap {1e3 * sum(clock.gaps) / len(clock.gaps):.2f} ms a step (a step's readback to the "
                  f"next launch; a GPU idles through it unless a step is in flight; on CPU the launch computes the "
                  f"step, so the gap holds it), readback wait "
                  f"{1e3 * sum(clock.waits) / len(clock.waits):.2f} ms, {clock.overlapped} of {len(clock.waits)} "
                  f"readbacks after the next launch (overlap_steps={self.engine.overlap_steps})")
        del self.engine._step  # back to the class's method
        self.engine.step_clock = None


def main() -> None:
    from hybridflow.models import fetch_default_model, load_causal_lm, load_tokenizer
    from hybridflow.rollout import SamplingParams

    args = parse_args()
    torch.set_num_threads(args.threads)
    if args.shape:
        return main_synthetic(args)
    model_path = args.model_path or fetch_default_model()
    model = load_causal_lm(model_path, dtype=args.dtype).to(args.device).eval().requires_grad_(False)
    tokenizer = load_tokenizer(model_path)
    print(machine_description(args))
    print(f"model: {model_path} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params)")
    engines = build_engines(args.engines.split(","), model, tokenizer, model_path)
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    for batch in batches:
        prompts = arithmetic_prompts(tokenizer, batch * args.requests_per_slot // args.n, seed=args.seed + batch)
        params = SamplingParams(n=args.n, temperature=1.0, max_tokens=args.max_tokens,
                                stop_token_ids=[tokenizer.eos_token_id], seed=args.seed)
        runs = {}
        for name, engine in engines.items():
            warm_up(engine, prompts, params)
            native = name.startswith("native")
            if native:
                engine.max_num_seqs = batch  # continuous batching keeps these slots full
            timer = StepTimer(engine) if args.step_times and native else None
            runs[name] = run_engine(name, engine, prompts, params, batch, chunk=None if native else batch // args.n)
            if timer:
                timer.report(f"batch {batch:4d} {name}")
        rows.append((batch, runs))
        report_runs(batch, runs)
    # Measured after the engines, on the same (shared) machine: the rates a decode step can reach.
    curves = matmul_curve(model, max_rows=max(batches), device=args.device, dtype=getattr(torch, args.dtype))
    report_machine(model, curves, device=args.device)
    curve = fastest(curves)
    floors = {batch: floors_for(runs["native"], model=model, curve=curve) for batch, runs in rows if "native" in runs}
    if args.requests_per_slot > 1:  # the step floor models one synchronous call of `batch` sequences
        floors = {batch: replace(f, step=float("nan"), step_seconds=float("nan")) for batch, f in floors.items()}
    for batch, runs in rows:
        if batch in floors:
            report_floors(batch, runs["native"], floors[batch])
    print_table(rows, floors)


def report_runs(batch: int, runs: dict[str, EngineRun]) -> None:
    for run in runs.values():
        print(f"batch {batch:4d} {run.engine:>6}: {run.tokens:6d} tokens in {run.seconds:7.1f} s = "
              f"{run.tokens_per_s:8.1f} tok/s, TTFT {1e3 * run.ttft:.0f} ms (mean response {run.mean_length:.0f} tokens, "
              f"{len(decode_rows_per_step(run.lengths))} decode steps)")
    native = runs.get("native")
    for name, run in runs.items():
        if native and name != "native":
            print(f"batch {batch:4d} native / {name}: {native.tokens_per_s / run.tokens_per_s:.2f}x")
    print(f"batch {batch:4d} load avg {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)


def report_machine(model, curves: dict[str, dict[int, float]], *, device: str) -> None:
    """The measured matmul times by row count, and the weight-read bound of one step."""
    size = weight_bytes(model)
    stream = weight_stream_seconds(model, device=device)
    print(f"one decode step reads {size / 1e6:.0f} MB of weights; streaming them takes "
          f"{1e3 * stream:.1f} ms ({size / stream / 1e9:.1f} GB/s, a sum over as many bytes)")
    print("matmul ms per decode step by live rows: " + "; ".join(
        f"{kernel} " + " ".join(f"{rows}:{1e3 * s:.1f}" for rows, s in curve.items())
        for kernel, curve in curves.items()))


def report_floors(batch: int, native: EngineRun, floors: Floors) -> None:
    steps = decode_rows_per_step(native.lengths)
    print(f"batch {batch:4d} flat floor: {floors.flat_gflops:.1f} GFLOP/s at {batch} rows = {floors.flat:.1f} tok/s; "
          f"native at {100 * native.tokens_per_s / floors.flat:.0f} %")
    if floors.step != floors.step:  # NaN: more sequences than slots, no single synchronous call to price
        print(f"batch {batch:4d} step floor: n/a (continuous batching through {batch} slots)")
        return
    print(f"batch {batch:4d} step floor: {len(steps)} decode steps ({sum(r < 16 for r in steps)} with < 16 rows) "
          f"take >= {floors.step_seconds:.2f} s = {floors.step:.1f} tok/s; "
          f"native at {100 * native.tokens_per_s / floors.step:.0f} %")


def print_table(rows, floors: dict[int, Floors]) -> None:
    names = list(rows[0][1])
    print("\n| batch | " + " | ".join(f"{n} tok/s" for n in names) + " | " + " | ".join(f"{n} TTFT ms" for n in names)
          + " | native / hf | flat floor tok/s | native % | step floor tok/s | native % |")
    print("|---" * (2 * len(names) + 6) + "|")
    for batch, runs in rows:
        native = runs.get("native")
        ratio = native.tokens_per_s / runs["hf"].tokens_per_s if native and "hf" in runs else float("nan")
        cells = [f"{runs[n].tokens_per_s:.1f}" for n in names] + [f"{1e3 * runs[n].ttft:.0f}" for n in names]
        cells += [f"{ratio:.2f}x"]
        if batch in floors:
            f = floors[batch]
            cells += [f"{f.flat:.1f} ({f.flat_gflops:.0f} GFLOP/s)", f"{100 * native.tokens_per_s / f.flat:.0f} %",
                      f"{f.step:.1f}", f"{100 * native.tokens_per_s / f.step:.0f} %"]
        print(f"| {batch} | " + " | ".join(cells) + " |")


# ---------------------------------------------------------------------------------------------
# Random-init shapes on synthetic workloads (--shape): engines against each other and the roofline.


@dataclass
class Request:
    prompt: list[int]
    max_tokens: int


def add_fixed_workload_args(parser: argparse.ArgumentParser, *, max_tokens: int) -> None:
    """The fixed workload's flags (rows, prompt and output lengths, threads) of the decode benchmarks built on this
    one (decode_floor.py, moe_decode.py)."""
    parser.add_argument("--batches", default="16,64", help="rows per generate call")
    parser.add_argument("--prompt-len", type=int, default=64, help="random prompt tokens per row")
    parser.add_argument("--max-tokens", type=int, default=max_tokens, help="new tokens per row (EOS ignored)")
    parser.add_argument("--threads", type=int, default=2)


def synthetic_requests(args, *, batch: int, vocab_size: int) -> list[Request]:
    """The workload's requests: random prompt tokens, exact output lengths (EOS ignored)."""
    if args.workload == "nano-vllm":  # nano-vllm's bench.py: seed(0), 256 x randint(100, 1024) in and out
        rng = random.Random(0)
        lengths = [(rng.randint(100, 1024), rng.randint(100, 1024)) for _ in range(256)]
    else:
        lengths = [(args.prompt_len, args.max_tokens)] * batch
    rng = random.Random(args.seed + batch)
    return [Request([rng.randrange(vocab_size) for _ in range(p)], out) for p, out in lengths]


def run_native(engine, requests: list[Request], temperature: float) -> float:
    from hybridflow.rollout import SamplingParams

    params = [SamplingParams(n=1, temperature=temperature, max_tokens=r.max_tokens, ignore_eos=True, seed=0,
                             logprobs=True) for r in requests]
    prompts = [r.prompt for r in requests]
    engine.capture()  # CUDA graphs at start-up, as vLLM does (outside the timing, like engine construction)
    warm = [replace(params[0], max_tokens=4)] * min(len(prompts), 2)
    engine.generate(prompts[: len(warm)], warm)
    return timed(lambda: engine.generate(prompts, params), check=lambda out: sum(len(c.token_ids) for c in out),
                 expected=sum(r.max_tokens for r in requests))


def timed(work, *, check, expected: int) -> float:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    synchronize(device)
    start = time.perf_counter()
    out = work()
    synchronize(device)
    seconds = time.perf_counter() - start
    if check(out) != expected:
        raise RuntimeError(f"generated {check(out)} tokens, expected {expected}")
    return seconds


def run_hf(model, requests: list[Request], temperature: float, *, static: bool) -> float:
    """HF ``generate`` on equal-length rows (one call; ``static``: static cache + torch.compile)."""
    if len({(len(r.prompt), r.max_tokens) for r in requests}) != 1:
        raise ValueError("HF generate runs only the fixed workload (one length for every row)")
    device = next(model.parameters()).device
    ids = torch.tensor([r.prompt for r in requests], device=device)
    new = requests[0].max_tokens
    kwargs = dict(attention_mask=torch.ones_like(ids), do_sample=True, temperature=temperature, top_k=0,
                  max_new_tokens=new, min_new_tokens=new, pad_token_id=0, eos_token_id=None)
    if static:
        kwargs.update(cache_implementation="static", disable_compile=False)
        model.generate(ids, **kwargs)  # compiles for these shapes
    else:
        model.generate(ids[:2], **{**kwargs, "attention_mask": torch.ones_like(ids[:2]), "max_new_tokens": 4,
                                   "min_new_tokens": 4})
    return timed(lambda: model.generate(ids, **kwargs), check=lambda out: (out.shape[1] - ids.shape[1]) * len(ids),
                 expected=new * len(requests))


def main_synthetic(args) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from model_shapes import random_model

    from hybridflow.rollout.native import NativeEngine

    model = random_model(args.shape, dtype=args.dtype, device=args.device)
    print(machine_description(args))
    print(f"model: random-init {args.shape} ({sum(p.numel() for p in model.parameters()) / 1e9:.2f}B params), "
          f"workload {args.workload}")
    bandwidth = copy_bandwidth(args.device, megabytes=1024 if args.device.startswith("cuda") else 256)
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write)")
    batches = [256] if args.workload == "nano-vllm" else [int(b) for b in args.batches.split(",")]
    temperature = 0.6 if args.workload == "nano-vllm" else 1.0
    rows = []
    for batch in batches:
        requests = synthetic_requests(args, batch=batch, vocab_size=model.config.vocab_size)
        max_len = max(len(r.prompt) + r.max_tokens for r in requests)
        floor = roofline_bytes(model, requests) / bandwidth
        tokens = sum(r.max_tokens for r in requests)
        for name in args.engines.split(","):
            try:
                if name in OVERLAP:
                    engine = NativeEngine(model, max_num_seqs=len(requests), max_model_len=max_len,
                                          enforce_eager=args.enforce_eager, num_kv_blocks=args.num_kv_blocks,
                                          max_num_batched_tokens=args.max_num_batched_tokens,
                                          enable_chunked_prefill=args.max_num_batched_tokens is not None,
                                          overlap_steps=OVERLAP[name])
                    timer = StepTimer(engine) if args.step_times else None
                    seconds = run_native(engine, requests, temperature)
                    print(f"batch {batch} {name}: {engine.cache.blocks} KV blocks, {engine.preemptions} preemptions")
                    if timer:
                        timer.report(f"batch {batch:4d} {name}")
                    if args.profile_admission and name == "native":
                        profile_admission(engine, requests)
                    if args.breakdown and name == "native" and engine.graphs is not None:
                        decode_breakdown(engine, rows=len(requests), context=max_len // 2, temperature=temperature)
                    del engine
                else:
                    seconds = run_hf(model, requests, temperature, static=name == "hf-static")
            except Exception as error:  # one engine failing must not lose the others' numbers
                print(f"batch {batch} {name}: failed: {type(error).__name__}: {str(error).splitlines()[0][:200]}")
                continue
            steps = max(r.max_tokens for r in requests)
            rows.append((batch, name, tokens / seconds, 1e3 * seconds / steps, floor / seconds))
            print(f"batch {batch:4d} {name:>9}: {tokens} tokens in {seconds:.2f} s = {tokens / seconds:,.0f} tok/s, "
                  f"{1e3 * seconds / steps:.2f} ms per step, roofline share {100 * floor / seconds:.0f} %", flush=True)
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
    print_synthetic_table(rows)


def cuda_ms(work, repeats: int = 20) -> float:
    """Median milliseconds of ``work()`` on the GPU (CUDA events, after one warm-up)."""
    work()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        work()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def decode_breakdown(engine, *, rows: int, context: int, temperature: float) -> None:
    """One decode step at ``rows`` rows of ``context`` positions: the graph replay, one layer's attention
    (with the bandwidth it reaches), and the sampling; the rest of a step is host work."""
    from hybridflow.rollout import SamplingParams
    from hybridflow.rollout.sampler import RowSampling, sample_tokens
    from hybridflow.rollout.triton_attention import paged_decode_attention

    decoder, cache = engine.decoder, engine.cache
    rows = min(rows, engine.max_num_seqs, (cache.blocks - 1) // -(-context // cache.block_size))
    tokens = torch.randint(decoder.vocab_size, (rows,), device="cuda")
    positions = torch.full((rows,), context - 1, device="cuda")
    # Each row its own blocks, in order (1 ..): what a fresh pool hands out.
    width = -(-context // cache.block_size)
    tables = (torch.arange(rows * width, device="cuda", dtype=torch.int32).view(rows, width) + 1)
    graphs = engine._graphs_for(cache)
    graph_ms = cuda_ms(lambda: graphs(token_ids=tokens, positions=positions, block_tables=tables))
    q = torch.randn(rows, decoder.num_heads, decoder.head_dim, device="cuda", dtype=decoder.embed.dtype)
    keys, values = cache.layer(0)
    attention_ms = cuda_ms(lambda: paged_decode_attention(q=q, keys=keys, values=values, lengths=positions + 1,
                                                          scale=decoder.scale, block_tables=tables))
    kv_bytes = 2 * rows * context * decoder.kv_heads * decoder.head_dim * cache.data.element_size()
    logits = graphs(token_ids=tokens, positions=positions, block_tables=tables).clone()
    sampling = RowSampling.uniform(SamplingParams(temperature=temperature), rows=rows, vocab_size=decoder.vocab_size,
                                   device="cuda")
    sampling_ms = cuda_ms(lambda: sample_tokens(logits=logits, params=sampling))
    print(f"breakdown at {rows} rows x {context} positions: graph replay {graph_ms:.2f} ms (attention "
          f"{attention_ms * decoder.num_layers:.2f} ms of it: {attention_ms:.3f} ms a layer, "
          f"{kv_bytes / attention_ms / 1e6:.0f} GB/s), sampling {sampling_ms:.2f} ms", flush=True)


def profile_admission(engine, requests: list[Request]) -> None:
    """Admit every request with ``max_tokens=1`` (its prefill and first token, no decode step) under the
    profiler: the wall time, and the ops that took the most host and device time."""
    from hybridflow.rollout import SamplingParams

    params = SamplingParams(n=1, temperature=1.0, max_tokens=1, seed=0)
    prompts = [r.prompt for r in requests]
    tokens = sum(map(len, prompts))
    decoder = engine.decoder
    default = decoder.varlen_prefill
    for varlen in dict.fromkeys([default, False]):  # the default path, then per-prompt SDPA for comparison
        decoder.varlen_prefill = varlen
        seconds = timed(lambda: engine.generate(prompts, params), check=len, expected=len(prompts))
        print(f"admission alone ({'varlen FlashAttention' if varlen else 'SDPA per prompt'}): {len(prompts)} prompts, "
              f"{tokens} tokens in {seconds:.2f} s = {tokens / seconds:,.0f} prompt tok/s", flush=True)
    decoder.varlen_prefill = default
    on_gpu = torch.cuda.is_available()
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if on_gpu else [])
    with torch.profiler.profile(activities=activities) as profile:
        engine.generate(prompts, params)
        synchronize("cuda" if on_gpu else "cpu")
    events = profile.key_averages()
    for key, label in (("self_cpu_time_total", "host"), ("self_device_time_total", "device")):
        top = sorted(events, key=lambda e: getattr(e, key, 0), reverse=True)[:8]
        print(f"top {label} time: " + "; ".join(
            f"{e.key[:40]} x{e.count} {getattr(e, key, 0) / 1e3:.0f} ms" for e in top), flush=True)


def print_synthetic_table(rows) -> None:
    print("\n| batch | engine | output tok/s | ms / decode step | HBM roofline share | vs hf | vs hf-static |")
    print("|---|---|---|---|---|---|---|")
    rates = {(batch, name): rate for batch, name, rate, _, _ in rows}
    for batch, name, rate, step_ms, share in rows:
        ratios = [f"{rate / rates[(batch, base)]:.2f}x" if (batch, base) in rates else "-" for base in ("hf", "hf-static")]
        print(f"| {batch} | {name} | {rate:,.0f} | {step_ms:.2f} | {100 * share:.0f} % | " + " | ".join(ratios) + " |")


if __name__ == "__main__":
    main()

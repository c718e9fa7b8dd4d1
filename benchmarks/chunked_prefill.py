"""What chunked prefill buys the native engine: decode stalls and prefill memory, chunked vs whole prompts.

Workload (streaming, engine level): a :class:`StreamingSession` decodes ``--live`` rows (EOS ignored); after
``--arrive-at`` steps, ``--arrivals`` prompts of ``--prompt-len`` random tokens are submitted at once, and the
session runs ``--steps`` more steps. Every step decodes one token for each live row, so a step's wall time is
the live rows' inter-token latency. Without chunking, the step the long prompts arrive in prefills them whole
before anyone decodes; with ``enable_chunked_prefill`` and ``max_num_batched_tokens=--budget``, each step
spends at most the budget (the rows' decode tokens first, prompt chunks with the rest). Reported per engine:
the longest step (the stall), p99 and p50 step times, when the arrivals' first tokens came (seconds after they
were submitted) and the total wall time.

Prefill memory: one ``--memory-prompt-len`` prompt generated alone (1 token), after a warm-up run of the same call (so
the KV pages it writes are already resident); the peak growth of this process's resident set over the call,
sampled every millisecond by a thread. That is the activations and temporaries of the prefill passes.

    python benchmarks/chunked_prefill.py                            # SmolLM2-135M-shaped random model, fp32, CPU
    python benchmarks/chunked_prefill.py --shape tiny-llama --prompt-len 256 --budget 64 --memory-prompt-len 512
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see benchmarks/rollout.py

import torch  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="smollm2-135m", help="random-init shape (benchmarks/model_shapes.py)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--live", type=int, default=8, help="rows decoding when the long prompts arrive")
    parser.add_argument("--arrivals", type=int, default=2, help="long prompts submitted at once")
    parser.add_argument("--prompt-len", type=int, default=1024)
    parser.add_argument("--budget", type=int, default=256, help="max_num_batched_tokens of the chunked engine")
    parser.add_argument("--arrive-at", type=int, default=4, help="decode steps before the long prompts arrive")
    parser.add_argument("--steps", type=int, default=24, help="steps run after they arrive")
    parser.add_argument("--memory-prompt-len", type=int, default=2048,
                        help="the prompt of the prefill-memory measurement (attention scores grow with its square)")
    return parser.parse_args(argv)


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_growth(work) -> int:
    """Peak resident-set growth while ``work()`` runs, sampled every millisecond from another thread."""
    from hybridflow.cpu import return_freed_memory

    return_freed_memory()
    base, peak, done = resident_bytes(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], resident_bytes())
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        work()
    finally:
        done.set()
        sampler.join()
    return max(peak[0], resident_bytes()) - base


def random_prompts(count: int, length: int, *, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(count)]


def streaming_steps(engine, args, vocab: int) -> dict:
    """Step times of the live rows around the arrival of the long prompts, and when those got their first token."""
    from hybridflow.rollout import SamplingParams
    from hybridflow.rollout.streaming import StreamingSession

    params = SamplingParams(n=1, temperature=0, max_tokens=args.arrive_at + args.steps + 2, ignore_eos=True,
                            logprobs=True)
    session = StreamingSession(engine, params, max_prompt_length=args.prompt_len)
    for index, prompt in enumerate(random_prompts(args.live, 16, vocab=vocab, seed=1)):
        session.submit(("live", index), prompt)
    for _ in range(args.arrive_at):
        session.step()
    arrived = time.perf_counter()
    for index, prompt in enumerate(random_prompts(args.arrivals, args.prompt_len, vocab=vocab, seed=2)):
        session.submit(("long", index), prompt)
    steps, first_token = [], float("nan")  # nan: they had not all joined within --steps
    for _ in range(args.steps):
        start = time.perf_counter()
        session.step()
        steps.append(time.perf_counter() - start)
        if first_token != first_token and len(session.run.live) == args.live + args.arrivals:
            first_token = time.perf_counter() - arrived
    session.pause()  # give the cache back: generate and a session share it
    steps.sort()
    return {"max": steps[-1], "p99": steps[min(len(steps) - 1, round(0.99 * (len(steps) - 1)))],
            "p50": steps[len(steps) // 2], "first_token": first_token, "total": time.perf_counter() - arrived,
            "peak_step_tokens": session.run.peak_step_tokens}


def prefill_memory(engine, args, vocab: int) -> tuple[int, float]:
    """``(peak resident growth in bytes, seconds)`` of generating one token after one ``--memory-prompt-len`` prompt."""
    from hybridflow.rollout import SamplingParams

    prompt = random_prompts(1, args.memory_prompt_len, vocab=vocab, seed=3)
    params = SamplingParams(n=1, temperature=0, max_tokens=1)
    engine.generate(prompt, params)  # the cache's pages for these blocks are touched once, here
    start = time.perf_counter()
    growth = peak_growth(lambda: engine.generate(prompt, params))
    return growth, time.perf_counter() - start


def build(model, args, *, chunked: bool):
    from hybridflow.rollout.native import NativeEngine

    return NativeEngine(model, None, max_num_seqs=args.live + args.arrivals, max_num_batched_tokens=args.budget,
                        enable_chunked_prefill=chunked,
                        max_model_len=max(args.prompt_len + args.arrive_at + args.steps, args.memory_prompt_len) + 8)


def main(argv=None) -> dict[str, dict]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from model_shapes import random_model

    from hybridflow.cpu import describe_cpu

    model = random_model(args.shape, dtype="float32", device="cpu")
    vocab = model.config.vocab_size
    print(f"# {args.shape} (random init), fp32, CPU {describe_cpu()}, {args.threads} threads, load average "
          f"{os.getloadavg()[0]:.2f}; {args.live} rows decoding, {args.arrivals} prompts of {args.prompt_len} tokens "
          f"arrive after {args.arrive_at} steps; budget {args.budget} tokens a step (chunked) / a pass (whole); "
          f"prefill memory of one {args.memory_prompt_len}-token prompt")
    results = {}
    for name, chunked in (("whole prompts", False), ("chunked", True)):
        engine = build(model, args, chunked=chunked)
        streaming_steps(engine, args, vocab)  # warm-up: caches, rope table, first-touch pages
        results[name] = streaming_steps(engine, args, vocab)
        results[name]["memory"], results[name]["prefill_s"] = prefill_memory(engine, args, vocab)
        del engine
    print("| prefill | longest step (stall) | p99 step | p50 step | arrivals' first token | total | most tokens a step "
          "| prefill of one prompt: peak RSS growth, time |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['max'] * 1e3:.0f} ms | {r['p99'] * 1e3:.0f} ms | {r['p50'] * 1e3:.0f} ms | "
              f"{r['first_token']:.2f} s | {r['total']:.2f} s | {r['peak_step_tokens']} | "
              f"{r['memory'] / 2**20:.0f} MiB, {r['prefill_s']:.2f} s |")
    whole, chunked = results["whole prompts"], results["chunked"]
    print(f"longest stall: chunked / whole = {chunked['max'] / whole['max']:.2f}; prefill peak memory: chunked / "
          f"whole = {chunked['memory'] / max(whole['memory'], 1):.2f}")
    return results


if __name__ == "__main__":
    main()

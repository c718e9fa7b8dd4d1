"""The policy head's log-prob + entropy, forward and backward: the torch path against the C kernel (issue 62).

``[rows, vocab]`` bf16 logits (default: a SmolLM2 GRPO step's ~1,017 response positions x 49,152), labels, an
upstream gradient on the log-probs (and on the entropy with ``--entropy-grad``); the two paths interleaved in one
process, min of ``--repeats``, CPU time at one thread (process_time: robust to other load on the machine), wall
time at more. glibc is told to keep freed memory (no trim, no mmap), as the trainer's long-lived process
effectively does, so each run does not pay first-touch page faults on a fresh [rows, vocab] gradient.

    python benchmarks/logprob_head.py --threads 1,2 --repeats 7
"""

from __future__ import annotations

import argparse
import time

import torch

from hybridflow.algos import logprob_and_entropy as torch_head
from hybridflow.cpu import keep_freed_heap
from hybridflow.models import logprob_kernel


def one_step(head, logits, labels, upstream, entropy_grad: bool) -> None:
    leaf = logits.detach().requires_grad_(True)
    log_probs, entropy = head(logits=leaf, labels=labels, calculate_entropy=True)
    loss = (log_probs * upstream).sum() + ((entropy * upstream).sum() if entropy_grad else 0)
    loss.backward()


def measure(rows: int, vocab: int, threads: int, repeats: int, entropy_grad: bool) -> dict[str, float]:
    """Best seconds of each path (CPU time at one thread, wall time otherwise)."""
    generator = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(rows, vocab, generator=generator)).to(torch.bfloat16)
    labels = torch.randint(0, vocab, (rows,), generator=generator)
    upstream = torch.randn(rows, generator=generator)
    heads = {"torch": torch_head, "kernel": logprob_kernel.kernel_logprob_and_entropy}
    clock = time.process_time if threads == 1 else time.perf_counter
    torch.set_num_threads(threads)
    best = dict.fromkeys(heads, float("inf"))
    for _ in range(repeats):
        for name, head in heads.items():
            start = clock()
            one_step(head, logits, labels, upstream, entropy_grad)
            best[name] = min(best[name], clock() - start)
    return best


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1017)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    if logprob_kernel.unavailable_reason() is not None:
        raise SystemExit(f"no kernel to measure: {logprob_kernel.unavailable_reason()}")
    keep_freed_heap()  # the trainer's heap policy: no first-touch faults in the timings
    for threads in map(int, args.threads.split(",")):
        for entropy_grad in (False, True):
            best = measure(args.rows, args.vocab, threads, args.repeats, entropy_grad)
            clock = "CPU" if threads == 1 else "wall"
            print(f"[{args.rows}, {args.vocab}] bf16, {threads} thread(s), entropy gradient {entropy_grad}: "
                  f"torch {best['torch'] * 1e3:.1f} ms, kernel {best['kernel'] * 1e3:.1f} ms "
                  f"({best['torch'] / best['kernel']:.1f}x; {clock} time, min of {args.repeats})", flush=True)


if __name__ == "__main__":
    main()

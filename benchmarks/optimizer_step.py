"""AdamW step time on a model's parameter shapes: fused kernel vs foreach vs the per-tensor loop.

hybridflow's optimizer (``hybridflow.workers.optim.build_optimizer``) takes the fused kernel
wherever every parameter sits on a device that has one. This measures why, in one run, on
the model's real shapes (SmolLM2-135M-Instruct by default; ``--model tiny`` for a smoke run),
and checks that the three give the same weights after the timed steps.

    python benchmarks/optimizer_step.py [--model PATH|default|tiny] [--repeats 5]

The floor: an AdamW step reads the parameter, gradient and two moments and writes three of
them back: 7 x 4 bytes per parameter in fp32, at the memory bandwidth measured here.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "2")

import torch  # noqa: E402

from hybridflow.cpu import describe_cpu  # noqa: E402

IMPLEMENTATIONS = {"fused": dict(fused=True), "foreach": dict(foreach=True), "for-loop": dict(foreach=False)}


def parameter_shapes(model: str) -> list[torch.Size]:
    from hybridflow.models import build_tiny_model, load_causal_lm

    if model == "tiny":
        module, _ = build_tiny_model("llama", seed=0)
    else:
        from hybridflow.models.default_model import fetch_default_model

        module = load_causal_lm(fetch_default_model() if model == "default" else model, dtype="float32")
    return [p.shape for p in module.parameters()]


def copy_bandwidth() -> float:
    """Bytes/s of a large in-place add (reads two, writes one), the memory traffic an optimizer makes."""
    a, b = torch.ones(32 * 2**20), torch.ones(32 * 2**20)
    a.add_(b)
    start = time.perf_counter()
    for _ in range(5):
        a.add_(b)
    return 3 * a.numel() * 4 * 5 / (time.perf_counter() - start)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    shapes = parameter_shapes(args.model)
    numel = sum(s.numel() for s in shapes)
    print(f"cpu: {describe_cpu()}, threads {torch.get_num_threads()}; {numel / 1e6:.1f}M parameters in "
          f"{len(shapes)} tensors")
    generator = torch.Generator().manual_seed(0)
    start_weights = [torch.randn(s, generator=generator) for s in shapes]
    grads = [torch.randn(s, generator=generator) for s in shapes]
    runs = {}
    for name, kwargs in IMPLEMENTATIONS.items():
        params = [torch.nn.Parameter(w.clone()) for w in start_weights]
        for p, g in zip(params, grads):
            p.grad = g
        runs[name] = (params, torch.optim.AdamW(params, lr=1e-5, **kwargs))
        runs[name][1].step()  # allocates the moments
    times = {name: [] for name in runs}
    for _ in range(args.repeats):  # interleaved, so every implementation sees the same load
        for name, (_, optimizer) in runs.items():
            start = time.perf_counter()
            optimizer.step()
            times[name].append(time.perf_counter() - start)
    floor = 7 * 4 * numel / copy_bandwidth()
    fused = statistics.median(times["fused"])
    print(f"floor (7 x 4 bytes per parameter at the measured bandwidth): {floor:.3f} s")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:9s} {median:.3f} s/step (median of {args.repeats}); {median / fused:.1f}x fused; "
              f"floor at {100 * floor / median:.0f} %")
    reference = runs["for-loop"][0]
    for name, (params, _) in runs.items():
        diff = max((p - r).abs().max().item() for p, r in zip(params, reference))
        print(f"max |{name} - for-loop| after {args.repeats + 1} steps: {diff:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""HF's RMSNorm and SwiGLU MLP against hybridflow.models.fused_norms, forward + backward, on a CPU under bf16 autocast.

One decoder layer's pieces at SmolLM2-135M's shape (hidden 576, MLP 1536) on ``--tokens`` tokens: the RMSNorm on the
fp32 residual stream, and the MLP (gate / up one matmul, hybridflow.models.fused_projections, as in training) with
HF's ``act(gate) * up`` or the fused SwiGLU. One thread, HF and fused interleaved in one process, min over
``--repeats`` of the CPU time (time.process_time), glibc told to keep freed memory (no first-touch page faults
on every fresh temporary, which dominate elementwise passes in a VM).

With ``--model``: the whole SmolLM2-135M-shaped model (random init, benchmarks/model_shapes.py), forward and
backward of one ``--tokens`` row (loss: the mean log-prob of the next token, full logits), under
``autocast_forward`` as training runs it, against a copy whose norms and MLPs keep HF's forwards; ``--threads``.

    python benchmarks/fused_norms.py --tokens 1400 --repeats 30
    python benchmarks/fused_norms.py --model --tokens 1400 --repeats 5 --threads 2
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hybridflow.models.fsdp import autocast_forward  # noqa: E402
from hybridflow.cpu import keep_freed_heap  # noqa: E402
from hybridflow.models.fused_norms import FusedMLPForward, FusedRMSNormForward, fuse_norms_and_swiglu  # noqa: E402
from hybridflow.models.fused_projections import fuse_sibling_projections  # noqa: E402


def layer_modules(hidden: int, intermediate: int):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

    config = LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, rms_norm_eps=1e-5, num_attention_heads=1,
                         num_key_value_heads=1)  # heads: unused, but the config checks them
    holder = torch.nn.ModuleDict({"norm": LlamaRMSNorm(hidden, eps=1e-5), "mlp": LlamaMLP(config)})
    with torch.no_grad():
        holder["norm"].weight.uniform_(0.5, 1.5)
    fuse_sibling_projections(holder)
    fused = copy.deepcopy(holder)
    assert fuse_norms_and_swiglu(fused) == 2
    return holder, fused


def step_seconds(module, x, upstream) -> float:
    start = time.process_time()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = module(x)
    torch.autograd.backward(out, upstream)
    return time.process_time() - start


def model_pair():
    """The SmolLM2-135M shape under autocast_forward twice (same seed), one with HF's norm and MLP forwards put back
    (two builds: a deep copy would share the autocast wrapper, bound to the first model's forward)."""
    from model_shapes import random_model

    models = [autocast_forward(random_model("smollm2-135m", dtype="float32", device="cpu").train().requires_grad_(),
                               device_type="cpu", dtype=torch.bfloat16) for _ in range(2)]
    restored = 0
    for module in models[0].modules():
        if isinstance(module.__dict__.get("forward"), (FusedRMSNormForward, FusedMLPForward)):
            del module.forward
            restored += 1
    assert restored == 30 * 3 + 1, restored
    return models


def model_seconds(model, ids) -> float:
    start = time.process_time()
    logits = model(input_ids=ids).logits
    loss = torch.log_softmax(logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None]).mean()
    loss.backward()
    model.zero_grad(set_to_none=True)
    return time.process_time() - start


def main_model(args) -> None:
    plain, fused = model_pair()
    ids = torch.randint(0, plain.config.vocab_size, (1, args.tokens), generator=torch.Generator().manual_seed(0))
    best = {}
    for _ in range(args.repeats):
        for name, model in (("hf", plain), ("fused", fused)):
            best[name] = min(best.get(name, float("inf")), model_seconds(model, ids))
    hf, ours = best["hf"], best["fused"]
    print(f"SmolLM2-135M shape, {args.tokens} tokens, {args.threads} thread(s), min of {args.repeats} (CPU s, "
          f"forward + backward): HF {hf:.3f}  fused {ours:.3f}  saved {hf - ours:.3f} s ({hf / ours:.3f}x)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1400)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--intermediate", type=int, default=1536)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--model", action="store_true", help="the whole model's forward + backward")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    keep_freed_heap()  # the trainer's heap policy: no first-touch faults in the timings
    torch.set_num_threads(args.threads)
    if args.model:
        return main_model(args)
    plain, fused = layer_modules(args.hidden, args.intermediate)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, args.tokens, args.hidden, generator=gen).requires_grad_()
    g_norm = torch.randn(1, args.tokens, args.hidden, generator=gen)
    g_mlp = torch.randn(1, args.tokens, args.hidden, generator=gen).bfloat16()
    best = {}
    for _ in range(args.repeats):
        for name, holder in (("hf", plain), ("fused", fused)):
            for part, upstream in (("norm", g_norm), ("mlp", g_mlp)):
                x.grad = None
                seconds = step_seconds(holder[part], x, upstream)
                best[name, part] = min(best.get((name, part), float("inf")), seconds)
    print(f"tokens {args.tokens}, hidden {args.hidden}, MLP {args.intermediate}, 1 thread, min of {args.repeats} "
          f"(CPU ms, forward + backward)")
    for part in ("norm", "mlp"):
        hf, ours = best["hf", part] * 1e3, best["fused", part] * 1e3
        print(f"  {part:5s} HF {hf:7.3f}  fused {ours:7.3f}  saved {hf - ours:6.3f} ms ({hf / ours:.2f}x)")


if __name__ == "__main__":
    main()

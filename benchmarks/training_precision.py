"""Does bf16 autocast or torch.compile of the log-prob math pay for the training forward on this CPU?

    OMP_NUM_THREADS=2 python benchmarks/training_precision.py [--layers 4 --batch 8 --length 256 --variants fp32,bf16,compiled]

Times one actor micro-batch (forward + log-probs + entropy + backward, what
``ActorWorker._micro_loss`` runs) on a random Llama with SmolLM2-135M's vocabulary and
head size, in fp32, under bf16 autocast (``model.dtype=bf16``), and with the log-prob /
entropy math compiled (``actor.use_torch_compile=True``, compile time reported apart).
Prints one line per variant: median seconds over the repeats.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hybridflow.cpu import describe_cpu
from hybridflow.models import compute_log_probs
from hybridflow.models.fsdp import autocast_forward


def step(model, ids, *, response: int, use_torch_compile: bool) -> None:
    log_probs, entropy = compute_log_probs(model, input_ids=ids, attention_mask=torch.ones_like(ids),
                                           position_ids=None, response_length=response, calculate_entropy=True,
                                           use_torch_compile=use_torch_compile)
    (log_probs.mean() + entropy.mean()).backward()
    model.zero_grad(set_to_none=True)


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", default="fp32,bf16,compiled", help="comma-separated subset to time")
    args = parser.parse_args()
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3,
                         num_hidden_layers=args.layers, num_attention_heads=9, num_key_value_heads=3,
                         tie_word_embeddings=True)
    torch.manual_seed(0)
    ids = torch.randint(0, args.vocab, (args.batch, args.length))
    response = args.length // 2
    print(f"cpu: {describe_cpu()}; threads {torch.get_num_threads()}; {args.layers} layers x {args.hidden}, "
          f"vocab {args.vocab}, batch {args.batch} x {args.length} tokens ({response} response)")
    variants = {"fp32": ("fp32", None, False), "bf16": ("bf16 autocast", torch.bfloat16, False),
                "compiled": ("fp32 + compiled log-prob math", None, True)}
    for name, dtype, compiled in (variants[v] for v in args.variants.split(",")):
        model = autocast_forward(LlamaForCausalLM(config), device_type="cpu", dtype=dtype)
        start = time.perf_counter()
        step(model, ids, response=response, use_torch_compile=compiled)  # warm-up (and compile)
        first = time.perf_counter() - start
        seconds = median_seconds(lambda: step(model, ids, response=response, use_torch_compile=compiled), args.repeats)
        print(f"{name:32s} {seconds:7.3f} s/micro-batch   (first call {first:.1f} s)")


if __name__ == "__main__":
    main()

"""What the paged KV cache costs a CPU decode step, and what the slot mirror and the paged kernel take back.

On CPU the decode step's attention reads ``N`` rows of keys and values through their block tables. Three ways,
priced in one run for SmolLM2-135M at batch ``--rows`` and several context lengths:

- SDPA over the gathered blocks (one ``index_select`` per layer and tensor, writing ``N x T`` positions, which
  moves the cache's bytes twice more);
- SDPA over the :class:`~hybridflow.rollout.kv_cache.SlotMirror` (a contiguous row per live sequence, written
  beside the pool), where the keys are a view;
- the C kernel of :mod:`hybridflow.rollout.cpu_attention`, reading the pool in place, each row its own length.

Each is timed as a whole decode step (``LlamaFamilyDecoder.decode``, every row at the full context, each layer's
keys its own memory) and as attention alone over all layers. Caveat: the "slot view" column reuses one
``[N, KV, T, D]`` tensor for every layer, so at short contexts it reads from the CPU's caches, not memory; the
step columns are the fair comparison (docs/benchmarks.md).

    PYTHONPATH=. python benchmarks/kv_layout.py --rows 64 --contexts 64,160,296
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as benchmarks/rollout.py: sleeping OpenMP threads

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from hybridflow.cpu import describe_cpu  # noqa: E402
from hybridflow.rollout import cpu_attention  # noqa: E402
from hybridflow.rollout.block_manager import BLOCK_SIZE  # noqa: E402
from hybridflow.rollout.decoder import LlamaFamilyDecoder  # noqa: E402
from hybridflow.rollout.kv_cache import MirroredCache, PagedKVCache, SlotMirror  # noqa: E402


def median_ms(work, repeats: int) -> float:
    work()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return 1e3 * sorted(times)[len(times) // 2]


def measure(decoder: LlamaFamilyDecoder, *, rows: int, context: int, repeats: int) -> tuple[float, ...]:
    """``(step ms gathering, step ms over the mirror, step ms with the paged kernel, attention ms over a slot
    view, attention ms gathering, attention ms of the paged kernel, ms to read the same keys and values once)``
    at ``rows`` x ``context``, attention over all layers (NaN for the kernel where it is not built)."""
    width = -(-context // BLOCK_SIZE)
    cache = PagedKVCache(layers=decoder.num_layers, blocks=rows * width + 1, block_size=BLOCK_SIZE,
                         kv_heads=decoder.kv_heads, max_len=width * BLOCK_SIZE, head_dim=decoder.head_dim,
                         dtype=decoder.embed.dtype, device="cpu")
    cache.data.normal_()
    # Scattered blocks, as a pool hands them out after a while.
    tables = (torch.randperm(rows * width) + 1).view(rows, width).to(torch.int32)
    positions = torch.full((rows,), context - 1)
    tokens = torch.randint(decoder.vocab_size, (rows,))
    kernel = decoder.paged_cpu_attention
    decoder.paged_cpu_attention = False  # the gathering path
    try:
        step_ms = median_ms(lambda: decoder.decode(token_ids=tokens, positions=positions, cache=cache,
                                                   block_tables=tables, context=context), repeats)
    finally:
        decoder.paged_cpu_attention = kernel
    kernel_ms = float("nan") if not kernel else median_ms(lambda: decoder.decode(
        token_ids=tokens, positions=positions, cache=cache, block_tables=tables, context=context), repeats)
    mirror = SlotMirror(layers=decoder.num_layers, rows=rows, kv_heads=decoder.kv_heads, max_len=width * BLOCK_SIZE,
                        head_dim=decoder.head_dim, dtype=decoder.embed.dtype)
    mirror.data.normal_()
    mirrored = MirroredCache(cache, mirror, 0)
    mirror_ms = median_ms(lambda: decoder.decode(token_ids=tokens, positions=positions, cache=mirrored,
                                                 block_tables=tables, context=context), repeats)
    slots = torch.randn(rows, decoder.kv_heads, width * BLOCK_SIZE, decoder.head_dim)
    q = torch.randn(rows, decoder.kv_heads, decoder.num_heads // decoder.kv_heads, decoder.head_dim)
    mask = torch.zeros(rows, 1, 1, width * BLOCK_SIZE)

    def slot_attention():
        for _ in range(decoder.num_layers):
            F.scaled_dot_product_attention(q, slots, slots, attn_mask=mask)

    def paged_attention():
        for layer in range(decoder.num_layers):
            keys, values = cache.span(layer, tables)
            F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)

    def kernel_attention():
        for layer in range(decoder.num_layers):
            keys, values = cache.layer(layer)
            cpu_attention.paged_decode_attention(q=q.view(rows, -1, decoder.head_dim), keys=keys, values=values,
                                                 block_tables=tables, lengths=positions + 1, scale=decoder.scale,
                                                 window=None)

    def read_floor():  # the same keys and values, read once in pool order: what attention cannot beat
        cache.data[:, :, :, 1 : 1 + rows * width].sum()

    kernel_attention_ms = median_ms(kernel_attention, repeats) if kernel else float("nan")
    return (step_ms, mirror_ms, kernel_ms, median_ms(slot_attention, repeats), median_ms(paged_attention, repeats),
            kernel_attention_ms, median_ms(read_floor, repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default=None, help="HF folder; default: the fetched SmolLM2-135M-Instruct")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--contexts", default="64,160,296")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from hybridflow.models import fetch_default_model, load_causal_lm

    model = load_causal_lm(args.model_path or fetch_default_model(), dtype="float32").eval().requires_grad_(False)
    decoder = LlamaFamilyDecoder(model)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"cpu: {describe_cpu()}, {os.cpu_count()} cores, torch threads {args.threads}, load avg {load}")
    print("| rows x context | step, gathering | step, over the mirror | step, paged kernel | mirror / kernel "
          "| attention, slot view | attention, gathering | attention, paged kernel | reading the KV once (floor) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for context in (int(c) for c in args.contexts.split(",")):
        step, mirrored, kernel, slot, paged, kernel_attention, floor = measure(decoder, rows=args.rows,
                                                                               context=context, repeats=args.repeats)
        print(f"| {args.rows} x {context} | {step:.1f} ms | {mirrored:.1f} ms | {kernel:.1f} ms | {mirrored / kernel:.2f}x "
              f"| {slot:.1f} ms | {paged:.1f} ms | {kernel_attention:.1f} ms | {floor:.1f} ms |", flush=True)


if __name__ == "__main__":
    with torch.no_grad():
        main()

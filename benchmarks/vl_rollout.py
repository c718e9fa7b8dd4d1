"""Vision-language rollout throughput: the native engine vs HF ``generate`` (the HF engine), in the same run.

RL-shaped workload, a VL GRPO rollout: ``--prompts`` chat-templated questions about a picture, one image each
(one prompt in eight has two and one none, so the rows of a batch differ), ``--n`` samples each at temperature 1,
EOS ignored so every response is exactly ``--max-tokens`` long (a random model does not stop like a trained one).
Both engines get the same call, ``generate(prompt_ids, params, multi_modal_inputs=[{pixel_values, image_grid_thw}
or None per prompt])``. Images are random pixels of ``--image-size`` (the longer side; the processor keeps at most
its square's pixels, in 28-pixel steps: 224 -> 64 image tokens, 448 -> 256).

Reported per engine:

- new tokens/s: the wall time of one ``generate`` call after a warm-up call (engine construction and CUDA graph
  capture excluded; everything else in: the vision tower, prefill, sampling);
- the prefill's share of it: the native engine's image encoding (one tower pass over the call's images) and its
  prompt prefill passes (one a prompt, shared by its ``n`` samples); HF's tower pass (transformers 5 also encodes
  each image once, then repeats its features for the samples) and first forward (every row, left-padded); the
  tower's own time beside it, with the GFLOP/s its matmuls reached (:func:`tower_flops`);
- the share of the decode memory roofline (as ``benchmarks/rollout.py``'s ``--shape`` runs): the bytes the decode
  steps must read (every weight matrix of the language model once a step, each row's cached keys and values once a
  token: ``rollout.roofline_bytes``) over the copy bandwidth measured in the same run, against the whole call and
  against its decode part (the call less its prefill).

Shapes (random init, config only, no download; ``model_shapes.VL_SHAPES``): ``tiny`` (hybridflow's tiny Qwen2.5-VL:
engine overheads alone), ``qwen2.5-vl-smollm2-135m`` (SmolLM2-135M's text dims under a ViT-B-sized tower: a CPU
shape) and ``qwen2.5-vl-3b`` (Qwen2.5-VL-3B-Instruct's dims: the GPU shape).

    python benchmarks/vl_rollout.py --shape tiny                        # CPU, fp32, 2 threads, 4 prompts x 4
    python benchmarks/vl_rollout.py --shape qwen2.5-vl-smollm2-135m
    python benchmarks/vl_rollout.py --shape qwen2.5-vl-3b --device cuda --dtype bfloat16 --prompts 16 --n 4 \\
        --image-size 448 --max-tokens 128                             # gpu_check.sh's vl-rollout stage: 64 rows
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from dataclasses import dataclass

# As benchmarks/rollout.py: sleeping OpenMP threads on shared cores (set before torch loads libgomp).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_shapes import VL_SHAPES, random_vl_model  # noqa: E402
from rollout import (  # noqa: E402
    Request,
    copy_bandwidth,
    kv_bytes_per_token,
    machine_description,
    roofline_bytes,
    synchronize,
    weight_bytes,
)

IMAGES_PER_PROMPT = (1, 1, 2, 1, 1, 0, 1, 1)
"""Images of prompt ``i``: ``IMAGES_PER_PROMPT[i % 8]`` (mostly one; a two-image and a text-only prompt)."""


@dataclass
class VLRun:
    """One engine's timed ``generate`` call."""

    engine: str
    seconds: float
    tokens: int
    """New tokens of every response together."""
    prefill_seconds: float
    """The images' encoding and the prompts' prefill (the vision tower included)."""
    tower_seconds: float
    """The vision tower's forwards alone."""
    decode_steps: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def decode_seconds(self) -> float:
        return self.seconds - self.prefill_seconds


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="tiny", choices=["tiny", *VL_SHAPES])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per generate call")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt (rows = prompts x n)")
    parser.add_argument("--max-tokens", type=int, default=64, help="new tokens of every response (EOS ignored)")
    parser.add_argument("--image-size", type=int, default=224, help="pixels of an image's longer side")
    parser.add_argument("--engines", default="native,hf", help="any of native, hf")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    unknown = set(args.engines.split(",")) - {"native", "hf"}
    if unknown:
        parser.error(f"unknown --engines {', '.join(sorted(unknown))}; choose from native, hf")
    return args


def random_image(rng: random.Random, width: int, height: int):
    from PIL import Image

    return Image.frombytes("RGB", (width, height), rng.randbytes(width * height * 3))


def vl_prompts(processor, count: int, *, image_size: int, seed: int) -> tuple[list[list[int]], list[dict | None]]:
    """``count`` prompts (ids through the chat template, each image expanded to its tokens) and their images (one
    ``multi_modal_inputs`` dict, or None, a prompt): a square image, and a 4:3 one second where there are two."""
    rng = random.Random(seed)
    ids, images = [], []
    for index in range(count):
        sizes = [(image_size, image_size), (image_size, image_size * 3 // 4)][: IMAGES_PER_PROMPT[index % 8]]
        pictures = [random_image(rng, w, h) for w, h in sizes]
        question = (f"In the figure, angle {rng.choice('ABCD')} is {rng.randint(20, 160)} degrees and side "
                    f"{rng.choice(['AB', 'BC', 'CD'])} is {rng.randint(2, 30)}. Find x. Think step by step.")
        content = [{"type": "image"} for _ in pictures] + [{"type": "text", "text": question}]
        text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                             tokenize=False)
        out = processor(text=[text], images=pictures or None, return_tensors="pt")
        ids.append(out["input_ids"][0].tolist())
        images.append({"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
                      if pictures else None)
    return ids, images


class PrefillClock:
    """The seconds one ``generate`` call spends in the vision tower and in prefill: forward hooks on the tower
    (both engines); the native engine's ``encode_images`` and prefill passes; HF's span from the tower's start to
    the end of its first forward (transformers 5 encodes a call's images once, before it repeats their features for
    the ``n`` samples and runs the first forward over every row)."""

    def __init__(self, model, engine, device: str):
        from hybridflow.models.vision import vision_tower
        from hybridflow.rollout.native import NativeEngine

        self.device, self.engine = device, engine
        self.seconds = {"tower": 0.0, "prefill": 0.0}
        self.started: dict[str, float] = {}
        tower = vision_tower(model)
        self.hooks, self.wrapped = [], []
        if isinstance(engine, NativeEngine):
            for owner, name in ((engine, "encode_images"), (engine.runner, "prefill")):
                setattr(owner, name, self._timed(getattr(owner, name)))
                self.wrapped.append((owner, name))
        else:  # the prefill's start hook on the tower goes first: the tower's time lies within the prefill's
            self.hf_prefill_done = False
            self.hooks += [tower.register_forward_pre_hook(lambda *_: self._hf_prefill(start=True)),
                           model.register_forward_pre_hook(lambda *_: self._hf_prefill(start=True)),
                           model.register_forward_hook(lambda *_: self._hf_prefill(start=False))]
        self.hooks += [tower.register_forward_pre_hook(lambda *_: self._start("tower")),
                       tower.register_forward_hook(lambda *_: self._stop("tower"))]

    @property
    def tower(self) -> float:
        return self.seconds["tower"]

    @property
    def prefill(self) -> float:
        return self.seconds["prefill"]

    def _start(self, what: str) -> None:
        synchronize(self.device)
        self.started[what] = time.perf_counter()

    def _stop(self, what: str) -> None:
        synchronize(self.device)
        self.seconds[what] += time.perf_counter() - self.started.pop(what)

    def _timed(self, method):
        def call(*args, **kwargs):
            self._start("prefill")
            try:
                return method(*args, **kwargs)
            finally:
                self._stop("prefill")

        return call

    def _hf_prefill(self, *, start: bool) -> None:
        if self.hf_prefill_done:
            return  # a decode step
        if start and "prefill" not in self.started:  # the tower's start, or the first forward's if no image
            self._start("prefill")
        elif not start:
            self._stop("prefill")
            self.hf_prefill_done = True

    def close(self) -> None:
        for hook in self.hooks:
            hook.remove()
        for owner, name in self.wrapped:
            delattr(owner, name)  # back to the class's method


def build_engine(name: str, model, tokenizer, *, rows: int, max_len: int):
    from hybridflow.rollout.hf import HFEngine
    from hybridflow.rollout.native import NativeEngine

    if name == "native":
        engine = NativeEngine(model, tokenizer, max_num_seqs=rows, max_model_len=max_len)
        engine.capture()  # CUDA graphs at start-up, as vLLM does (outside the timing, like construction)
        return engine
    return HFEngine(model, tokenizer, max_model_len=max_len)


def run_engine(name: str, engine, model, prompts, images, args) -> VLRun:
    """One warm-up call over two prompts, then the timed call over all of them."""
    from hybridflow.rollout import SamplingParams

    params = SamplingParams(n=args.n, temperature=1.0, max_tokens=args.max_tokens, ignore_eos=True, seed=args.seed,
                            logprobs=True)
    warm = SamplingParams(n=2, temperature=1.0, max_tokens=4, ignore_eos=True, seed=args.seed + 1)
    engine.generate(prompts[:2], warm, multi_modal_inputs=images[:2])
    reset = getattr(engine, "reset_prefix_cache", None)
    if reset is not None:  # a new rollout batch, as the rollout worker starts one: no tower outputs or blocks kept
        reset()
    clock = PrefillClock(model, engine, args.device)
    try:
        synchronize(args.device)
        start = time.perf_counter()
        completions = engine.generate(prompts, params, multi_modal_inputs=images)
        synchronize(args.device)
        seconds = time.perf_counter() - start
    finally:
        clock.close()
    tokens = sum(len(c.token_ids) for c in completions)
    expected = len(prompts) * args.n * args.max_tokens
    if tokens != expected:
        raise RuntimeError(f"{name} generated {tokens} tokens, expected {expected}")
    return VLRun(name, seconds, tokens, clock.prefill, clock.tower, args.max_tokens - 1)


def tower_flops(model, images: list[dict | None]) -> float:
    """FLOPs of the vision tower's matmuls over these images (attention's excluded: its windows are 8 x 8
    patches): 2 x each patch through the patch embedding and the blocks' matrices, 2 x each merged token (2 x 2
    patches) through the merger's."""
    tower = model.model.visual
    merger = {id(w) for w in tower.merger.parameters()}
    block_params = sum(w.numel() for w in tower.parameters() if w.dim() >= 2 and id(w) not in merger)
    merger_params = sum(w.numel() for w in tower.merger.parameters() if w.dim() >= 2)
    patches = sum(int(torch.as_tensor(row["image_grid_thw"]).prod(-1).sum()) for row in images if row)
    merged = patches // model.config.vision_config.spatial_merge_size ** 2
    return 2.0 * (patches * block_params + merged * merger_params)


def describe_workload(model, prompts, images, args) -> str:
    image_counts = [0 if row is None else len(row["image_grid_thw"]) for row in images]
    image_tokens = [prompt.count(model.config.image_token_id) for prompt in prompts]
    lengths = [len(p) for p in prompts]
    tower = sum(p.numel() for p in model.model.visual.parameters())
    total = sum(p.numel() for p in model.parameters())
    return (f"model: random-init Qwen2.5-VL {args.shape} ({total / 1e6:.1f}M params, vision tower {tower / 1e6:.1f}M), "
            f"{args.dtype}\n"
            f"workload: {len(prompts)} prompts x {args.n} samples = {len(prompts) * args.n} rows, "
            f"{sum(image_counts)} images ({', '.join(str(c) for c in image_counts[:8])}{' ...' if len(prompts) > 8 else ''}"
            f" a prompt, {args.image_size} px), prompt tokens {min(lengths)}-{max(lengths)} (mean "
            f"{sum(lengths) / len(lengths):.0f}, {sum(image_tokens)} image tokens in all), {args.max_tokens} new tokens "
            f"a row, temperature 1, EOS ignored")


def report_run(run: VLRun, floor_seconds: float, flops: float) -> None:
    print(f"{run.engine:>6}: {run.tokens} tokens in {run.seconds:.2f} s = {run.tokens_per_s:,.1f} tok/s; prefill "
          f"{run.prefill_seconds:.2f} s (vision tower {run.tower_seconds:.2f} s, {flops / run.tower_seconds / 1e9:,.0f} "
          f"GFLOP/s) = "
          f"{100 * run.prefill_seconds / run.seconds:.0f} % of the call; decode {run.decode_seconds:.2f} s = "
          f"{1e3 * run.decode_seconds / run.decode_steps:.1f} ms a step; roofline share "
          f"{100 * floor_seconds / run.seconds:.0f} % of the call, {100 * floor_seconds / run.decode_seconds:.0f} % "
          f"of its decode; load avg {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)


def print_table(shape: str, rows: int, runs: dict[str, VLRun], floor_seconds: float) -> None:
    print("\n| shape | rows | engine | new tok/s | prefill share (tower) | ms / decode step "
          "| roofline share: call / decode | vs hf |")
    print("|---|---|---|---|---|---|---|---|")
    hf = runs.get("hf")
    for name, run in runs.items():
        ratio = f"{run.tokens_per_s / hf.tokens_per_s:.2f}x" if hf else "-"
        print(f"| {shape} | {rows} | {name} | {run.tokens_per_s:,.1f} | {100 * run.prefill_seconds / run.seconds:.0f} % "
              f"({100 * run.tower_seconds / run.seconds:.0f} %) | {1e3 * run.decode_seconds / run.decode_steps:.1f} "
              f"| {100 * floor_seconds / run.seconds:.0f} % / {100 * floor_seconds / run.decode_seconds:.0f} % "
              f"| {ratio} |")


def main(argv: list[str] | None = None) -> None:
    from hybridflow.models.tiny import build_tiny_vl_processor

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    processor = build_tiny_vl_processor(max_pixels=args.image_size ** 2)
    model = random_vl_model(args.shape, processor.tokenizer, dtype=args.dtype, device=args.device, seed=args.seed)
    prompts, images = vl_prompts(processor, args.prompts, image_size=args.image_size, seed=args.seed)
    print(machine_description(args))
    print(describe_workload(model, prompts, images, args))
    bandwidth = copy_bandwidth(args.device, megabytes=1024 if args.device.startswith("cuda") else 256)
    requests = [Request(prompt, args.max_tokens) for prompt in prompts for _ in range(args.n)]
    floor = roofline_bytes(model, requests) / bandwidth
    print(f"decode roofline: {args.max_tokens - 1} steps read {weight_bytes(model) / 1e6:.0f} MB of weights each, "
          f"and {kv_bytes_per_token(model) / 1e3:.1f} kB a cached token a row; copy bandwidth "
          f"{bandwidth / 1e9:.1f} GB/s (read + write): >= {floor:.2f} s = "
          f"{len(requests) * args.max_tokens / floor:,.0f} tok/s", flush=True)
    flops = tower_flops(model, images)
    print(f"vision tower: {flops / 1e9:,.1f} GFLOP in its matmuls for the call's images (once each)")
    max_len = max(map(len, prompts)) + args.max_tokens
    runs = {}
    for name in args.engines.split(","):
        try:
            engine = build_engine(name, model, processor.tokenizer, rows=len(requests), max_len=max_len)
            runs[name] = run_engine(name, engine, model, prompts, images, args)
        except Exception as error:  # one engine failing (a one-shot GPU run) must not lose the other's numbers
            print(f"{name}: failed: {type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}",
                  flush=True)
            continue
        finally:
            engine = None  # the native engine's cache and graphs go before the next engine runs
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
        report_run(runs[name], floor, flops)
    if "native" in runs and "hf" in runs:
        print(f"native / hf: {runs['native'].tokens_per_s / runs['hf'].tokens_per_s:.2f}x")
    print_table(args.shape, len(requests), runs, floor)


if __name__ == "__main__":
    main()

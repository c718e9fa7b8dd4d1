"""The rollout benchmark's floors: the matmul rate by live row count, the weight stream, FLOPs per token, and the
two lower bounds on a ``generate`` call (every step full; the workload's real steps). Imported by rollout.py."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Floors:
    """Two lower bounds on a ``generate`` call's time, in tokens/s for its token count.

    ``flat``: every token at the matmul rate of ``batch`` rows (FLOPs per token over that
    rate), as if every decode step were full; ``step``: the workload's real decode steps,
    each at the measured matmul time of its live row count (:func:`step_floor_seconds`).
    """

    flat: float
    step: float
    flat_gflops: float
    step_seconds: float


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


MATMUL_KERNELS = ("F.linear", "packed")
"""How :func:`matmul_seconds` multiplies: plain ``F.linear``, or the weights packed once for
oneDNN as the native engine multiplies on CPU (``PackedLinear``; same as ``F.linear`` elsewhere).
The floors take the faster of the two at every row count."""

ROW_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
"""Row counts at which :func:`matmul_seconds` is measured; other counts are interpolated."""


def weight_matrices(model) -> list[torch.Tensor]:
    """Every matrix a decode step multiplies by: the projections and the (possibly tied) LM head (not a
    vision-language model's vision tower, which runs once per image, at admission)."""
    from hybridflow.models.vision import vision_tower

    embedding = model.get_input_embeddings().weight
    tower = vision_tower(model)
    skipped = {id(w) for w in tower.parameters()} if tower is not None else set()
    weights = [w for w in model.parameters() if w.dim() == 2 and w is not embedding and id(w) not in skipped]
    if model.get_output_embeddings().weight is embedding:
        weights.append(embedding)  # a tied LM head multiplies by the embedding
    return weights


def matmul_seconds(model, *, rows: int, device: str, dtype: torch.dtype, kernel: str = "F.linear",
                   repeats: int = 5) -> float:
    """Median seconds to push ``[rows, in]`` through every weight matrix of the model once.

    This is the matmul work of one decode step over ``rows`` sequences with the weights
    streamed from memory as a step streams them; a single matrix multiplied repeatedly
    would stay in cache and overstate what a decode step can reach at few rows.
    """
    from hybridflow.rollout.packed_linear import PackedLinear

    weights = weight_matrices(model)
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1], device=device, dtype=dtype) for w in weights}
    layers = [PackedLinear(w) if kernel == "packed" else (lambda x, w=w: F.linear(x, w)) for w in weights]

    def one_step():
        for w, layer in zip(weights, layers):
            layer(inputs[w.shape[1]])

    with torch.no_grad():
        return median_seconds(one_step, device=device, repeats=repeats)


def median_seconds(work, *, device: str, repeats: int) -> float:
    """Median wall seconds of ``work()`` over ``repeats`` runs after one untimed warm-up run."""
    times = []
    for _ in range(repeats + 1):
        synchronize(device)
        start = time.perf_counter()
        work()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return sorted(times[1:])[len(times[1:]) // 2]


def steady_matmul_flops(m: int, k: int, n: int, *, dtype: torch.dtype, warmup_s: float = 1.0, blocks: int = 5,
                        block_s: float = 0.1) -> float:
    """This CPU's FLOP/s on an ``[m, k] @ [k, n]`` matmul at its steady clock: the best of ``blocks`` timed blocks
    of at least ``block_s`` each, after ``warmup_s`` of untimed calls (the first fraction of a second runs slower
    while the cores ramp their clock and OpenMP wakes its threads, so a short cold probe reads low)."""
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    start, calls = time.perf_counter(), 0
    while calls == 0 or time.perf_counter() - start < warmup_s:
        torch.mm(a, b)
        calls += 1
    repeats = max(1, round(block_s * calls / (time.perf_counter() - start)))
    best = float("inf")
    for _ in range(blocks):
        began = time.perf_counter()
        for _ in range(repeats):
            torch.mm(a, b)
        best = min(best, (time.perf_counter() - began) / repeats)
    return 2 * m * k * n / best


def weight_bytes(model) -> int:
    """Bytes a decode step reads from the weight matrices."""
    return sum(w.numel() * w.element_size() for w in weight_matrices(model))


def matmul_curve(model, *, max_rows: int, device: str, dtype: torch.dtype) -> dict[str, dict[int, float]]:
    """``{kernel: {rows: seconds}}`` over :data:`ROW_GRID` up to ``max_rows`` (always including it)."""
    grid = sorted({r for r in ROW_GRID if r < max_rows} | {max_rows})
    return {kernel: {rows: matmul_seconds(model, rows=rows, device=device, dtype=dtype, kernel=kernel)
                     for rows in grid} for kernel in MATMUL_KERNELS}


def interpolate(curve: dict[int, float], rows: int) -> float:
    """``curve`` (rows -> seconds) at ``rows``, linear between the measured points."""
    points = sorted(curve.items())
    if rows <= points[0][0]:
        return points[0][1]
    for (r0, s0), (r1, s1) in zip(points, points[1:]):
        if rows <= r1:
            return s0 + (s1 - s0) * (rows - r0) / (r1 - r0)
    (r0, s0), (r1, s1) = points[-2], points[-1]
    return s1 + (s1 - s0) * (rows - r1) / (r1 - r0)


def decode_rows_per_step(lengths: list[int]) -> list[int]:
    """Live sequences in each decode step of a synchronous ``generate`` with these response lengths.

    The first token of every response comes from its prompt's prefill; token ``t`` (``t >= 1``)
    takes a decode step over every response longer than ``t``. Any engine that finishes one
    call before starting the next runs these steps, one after another: the longest response
    alone forces ``max(lengths) - 1`` of them.
    """
    return [sum(1 for n in lengths if n > t) for t in range(1, max(lengths, default=0))]


def step_floor_seconds(*, curve: dict[int, float], lengths: list[int], prompt_lengths: list[int],
                       attention_factor: float) -> float:
    """Fewest seconds the matmuls of this workload take at the measured rates.

    Each decode step costs the measured matmul time at its live row count, each prompt's
    prefill (once per prompt) the time at its length; ``attention_factor`` = total FLOPs /
    matmul FLOPs per token adds attention's QK^T and PV at the same rate.
    """
    decode = sum(interpolate(curve, rows) for rows in decode_rows_per_step(lengths))
    prefill = sum(interpolate(curve, rows) for rows in prompt_lengths)
    return (decode + prefill) * attention_factor


def fastest(curves: dict[str, dict[int, float]]) -> dict[int, float]:
    """Per row count, the fastest kernel's seconds at that row count or any larger one.

    A step over fewer rows could always pad to more, so its floor is never above a larger
    step's; taking the minimum from above also irons out timing noise in the strict direction.
    """
    best = {r: min(curve[r] for curve in curves.values()) for r in next(iter(curves.values()))}
    rows = sorted(best)
    return {r: min(best[larger] for larger in rows[i:]) for i, r in enumerate(rows)}


def weight_stream_seconds(model, *, device: str, repeats: int = 5) -> float:
    """Seconds to read as many bytes as the weight matrices hold (a ``sum``): the bandwidth bound of one step."""
    buffer = torch.ones(weight_bytes(model) // 4, device=device, dtype=torch.float32)
    return median_seconds(buffer.sum, device=device, repeats=repeats)


def weight_flops_per_token(model) -> float:
    """2 x the weights used by matmuls (projections and LM head)."""
    return 2.0 * sum(w.numel() for w in weight_matrices(model))


def flops_per_token(model, avg_context: float) -> float:
    """Matmul FLOPs + attention's QK^T and PV over the context."""
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    attention = 4 * config.num_hidden_layers * config.num_attention_heads * head_dim * avg_context
    return weight_flops_per_token(model) + attention


def floors_for(run: EngineRun, *, model, curve: dict[int, float]) -> Floors:
    """Both floors for the token count and response lengths of ``run``."""
    flops, weight_flops = flops_per_token(model, run.avg_context), weight_flops_per_token(model)
    flat_rate = weight_flops * run.batch / interpolate(curve, run.batch)
    seconds = step_floor_seconds(curve=curve, lengths=run.lengths, prompt_lengths=run.prompt_lengths,
                                 attention_factor=flops / weight_flops)
    return Floors(flat=flat_rate / flops, step=run.tokens / seconds, flat_gflops=flat_rate / 1e9,
                  step_seconds=seconds)


def kv_bytes_per_token(model) -> int:
    config = model.config.get_text_config()  # a vision-language model's language model
    if getattr(config, "kv_lora_rank", None):  # MLA (DeepSeek-V3): the latent and the rotated key, one part (issue 58)
        element = next(model.parameters()).element_size()
        return config.num_hidden_layers * (config.kv_lora_rank + config.qk_rope_head_dim) * element
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    element = next(model.parameters()).element_size()
    return config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * element


def roofline_bytes(model, requests: list[Request]) -> int:
    """Bytes the decode steps must read: the weights once per step (one step per token position past the
    first, all rows together) and, for every decoded token, its row's cached keys and values."""
    steps = max(r.max_tokens for r in requests) - 1
    cached = sum(len(r.prompt) + t for r in requests for t in range(1, r.max_tokens))
    return steps * weight_bytes(model) + cached * kv_bytes_per_token(model)


def copy_bandwidth(device: str, megabytes: int = 1024) -> float:
    """Bytes/s of a large device-to-device copy, counting bytes read plus bytes written."""
    source = torch.ones(megabytes << 18, device=device)  # float32: 4 bytes each
    target = torch.empty_like(source)
    seconds = median_seconds(lambda: target.copy_(source), device=device, repeats=10)
    return 2 * source.numel() * 4 / seconds

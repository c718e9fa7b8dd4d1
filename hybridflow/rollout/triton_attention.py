"""Decode attention over the paged KV cache as Triton kernels (CUDA only): split-K, per-row lengths and blocks.

A decode step's attention is bound by reading keys and values: each live row reads its own
``length`` positions of every KV head, nothing more. SDPA over the cache cannot do that
inside a static-shape step: its key span is one number for the whole batch, so every row would
read up to the longest row's length (the nano-vllm workload's rows range from 100 to 2048
tokens: about twice the bytes), and over a paged cache it needs the blocks gathered first. These
kernels read the lengths and the block tables from the device and load each key where its block
lies, so the step keeps static shapes (CUDA graphs) and reads only each row's live keys, once.

Flash-decoding (Dao et al. 2023, "Flash-Decoding for long-context inference"): the context of
row ``n`` is cut into splits of ``split_len`` positions; program ``(n, kv_head, split)``
computes, for the ``G = H / KV`` query heads that share that KV head (grouped-query attention,
no ``repeat_kv`` copy), the softmax-weighted values of its split and their log-sum-exp
``lse_s``; a second kernel combines the splits: ``out = sum_s exp(lse_s - lse) * out_s`` with
``lse = log sum_s exp(lse_s)``. Splits past the row's length do no work. With one split a row
(``split_len`` >= the table's span) the program writes the output itself and no combine runs.

How the tiles and the launch are chosen (:class:`DecodeConfig`, :func:`choose_config`; issue 46):

- **The floor.** A step reads ``2 x rows x length x KV x D x bytes``: Qwen3-0.6B's shape at 256 rows x
  ~1,000 positions (8 KV heads of 128, bf16) is 1.05 GB a layer, 0.256 ms at an H200's measured copy
  bandwidth (~4.1 TB/s), 0.34 ms at 75 % of it. The first kernel (:data:`MAIN_CONFIG`) took 0.488 ms
  (2.15 TB/s, 52 %). Partial outputs add ``rows x H x splits x (D + 1) x 4`` bytes written and read
  again: at 4 splits 17 MB, under 2 % of the keys and values.
- **Bytes in flight.** By Little's law the card reaches its bandwidth only with bandwidth x latency bytes
  requested and not yet arrived: 4.1 TB/s x ~0.8 us (loaded HBM latency) ~ 3.3 MB, ~25 KB per SM of 132.
  The first kernel's loop of 4 unrolled tiles needs 244 registers a thread (compiled for sm_90 with the
  ptxas in Triton's wheel, ``cuobjdump -res-usage``): 2 programs an SM, each with one tile of keys (64 x
  128 bf16 = 16 KB) in flight at a time, the values requested only after the softmax, nothing in flight
  in its prologue and epilogue. So: load the values beside the keys (``kv_together``, as FlashAttention's
  and FlashInfer's decode kernels do) and run the tile loop as a software pipeline (``tl.range(...,
  num_stages=S)``): the keys loaded as ``K^T [D, BLOCK_N]`` (a dot operand as loaded; a ``tl.trans`` of a
  ``[BLOCK_N, D]`` load the pipeliner leaves in registers), both tiles go to shared memory by ``cp.async``.
  The block-table load that addresses them takes one stage, so 3 stages keep one tile of keys and values
  (32 KB) ahead of the math and 5 keep two. At 3 stages the kernel takes 120-128 registers and 39 KB of
  shared memory: 4 programs an SM, up to 128 KB in flight, ~5x the need; 5 stages: ~130 registers, 72 KB,
  3 programs with 64 KB each. With pipelining the order of the two loads in the source no longer matters
  (the compiled kernels are the same); ``kv_together`` matters for 1 stage. ``tests/rollout/sm90_compile.py``
  compiles a config this way (no GPU needed).
- **Tiles of ~16 KB** (:data:`TILE_BYTES`): 64 keys at head dim 128 in bf16, 128 at 64 (SmolLM2),
  32 at 128 in fp32; a multiple of the page (16), and tiles start at multiples of it, so a tile reads
  whole pages (runs of ``page x D`` contiguous elements, 4 KB at 16 x 128 bf16) and no page is read by
  two tiles. The loop runs over the row's live tiles only (a dynamic trip count, which a pipelined loop
  needs), not over every tile of the split with the ones past the row's end masked.
- **Splits from the grid and the tail.** More splits mean more programs: the card filled at small batches,
  and a shorter tail (the last programs of a step run alone; at nano-vllm's lengths, 100-2,048, one
  program a row would leave a whole 2,048-position row, ~1 MB, to finish on an otherwise idle card). Fewer
  mean fewer partials, no combine kernel, and longer loops (a pipeline fills once a program). The chooser
  aims for :data:`PROGRAMS_PER_SM` programs an SM over ``rows x KV`` (row, head) pairs, each split a
  power-of-two number of tiles and at least :data:`MIN_SPLIT_TILES`: Qwen3-0.6B at 256 rows x 8 KV heads
  (2,048 pairs against 16 x 132) gets 2 splits of 1,024 positions; one split a row (no partials, no
  combine) once the pairs alone give every SM its programs. The choice depends only on static shapes
  (rows = a graph's batch bucket, the table width fixed per cache), so each graph keeps a fixed grid and a
  fixed kernel.

These defaults are reasoned, not yet measured: ``benchmarks/decode_attention.py`` (gpu_check's ``attn``
stage) times a sweep of configurations against :data:`MAIN_CONFIG` at the issue's shapes; its best per
shape is what :func:`choose_config` should return.

Shapes: ``q`` ``[N, H, D]``; ``keys`` / ``values`` ``[KV, blocks, B, D]`` (one layer of
:class:`~hybridflow.rollout.kv_cache.PagedKVCache`); ``block_tables`` ``[N, W]`` int32 (position ``p`` of
row ``n`` is at block ``block_tables[n, p // B]``, offset ``p % B``); ``lengths`` ``[N]`` int; returns
``[N, H, D]`` in ``q``'s dtype.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

SPAN_ROUNDING = 256
"""Positions a cache's block table spans are rounded up to (fewer distinct widths: fewer graphs and compiles)."""
TILE_BYTES = 16384
"""Bytes of keys per tile (as many again of values): 64 keys of 128 bf16 dims."""
PROGRAMS_PER_SM = 16
"""Programs per SM the split count aims for: 3-4 resident at a time, the rest a short tail across rows of
different lengths."""
MIN_SPLIT_TILES = 4
"""Fewest tiles a split has (unless the whole row is shorter): the pipeline's fill paid over several tiles."""
STAGES = 3
"""Software-pipeline stages of the tile loop: one for the block-table load, so 3 keep one tile of keys and values
in flight ahead of the math."""
NO_WINDOW = 2**30
"""The window the kernels get for none: longer than any row."""
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
"""Two workarounds for Triton 3.6's interpreter (the CPU tests), each the same arithmetic: it computes ``tl.dot`` of
bf16 operands from their bit patterns, so the products run on fp32 copies of the same bf16 values; and its
``tl.range`` cannot take a bound loaded from memory (numpy 2 refuses ``int()`` of its 1-element arrays), so the
tile loop runs as a ``while`` over the same tiles."""


@dataclass(frozen=True)
class DecodeConfig:
    """How :func:`paged_decode_attention` tiles and launches its kernel."""

    split_len: int
    """Positions a program reads (a multiple of ``block_n``); at least the table's span: one split, no combine."""
    block_n: int
    """Keys a tile (a power of two)."""
    num_warps: int = 4
    num_stages: int = STAGES
    """Stages of the tile loop's software pipeline (``tl.range``; 1 = none); the unrolled loop has none."""
    kv_together: bool = True
    """Load a tile's values beside its keys (both in flight), not after its softmax."""
    unrolled: bool = False
    """The first kernel's loop: ``split_len / block_n`` tiles unrolled, those past the row's end masked."""

    def splits(self, span: int) -> int:
        """Programs a (row, KV head) for a table spanning ``span`` positions."""
        return triton.cdiv(span, self.split_len)

    def label(self) -> str:
        loop = "unrolled" if self.unrolled else f"stages{self.num_stages}"
        return f"split{self.split_len}/n{self.block_n}/w{self.num_warps}/{loop}/{'kv' if self.kv_together else 'k,v'}"


MAIN_CONFIG = DecodeConfig(split_len=256, block_n=64, num_warps=4, num_stages=3, kv_together=False, unrolled=True)
"""The kernel before issue 46 (2.15 TB/s at Qwen3-0.6B's shape on an H200): the benchmark's baseline."""


@functools.cache  # a pure function of static shapes, asked once a layer by an eager step
def choose_config(*, rows: int, heads: int, kv_heads: int, head_dim: int, page: int, width: int, dtype: torch.dtype,
                  sms: int) -> DecodeConfig:
    """The tiles and launch for a step of ``rows`` rows (a graph's bucket), ``heads`` / ``kv_heads`` heads of
    ``head_dim``, block tables of ``width`` pages of ``page`` positions, on a card of ``sms`` SMs (the module
    docstring says why)."""
    del heads  # the group rides in one program: the grid is rows x KV heads x splits
    element = torch.finfo(dtype).bits // 8
    block_n = max(16, min(128, triton.next_power_of_2(TILE_BYTES // (head_dim * element))))
    if page & (page - 1) == 0 and page <= 128:
        block_n = max(block_n, page)  # whole pages a tile (any page works: positions are masked, not pages)
    tiles = triton.cdiv(width * page, block_n)
    wanted = triton.cdiv(PROGRAMS_PER_SM * sms, rows * kv_heads)  # splits a row
    per_split = max(MIN_SPLIT_TILES, tiles // wanted)
    if per_split < tiles:
        per_split = 2 ** (per_split.bit_length() - 1)  # a power of two: few distinct kernels
    return DecodeConfig(split_len=block_n * min(tiles, per_split), block_n=block_n)


@functools.cache
def _sm_count(device: torch.device) -> int:
    """SMs of a CUDA device (132 on an H100 / H200 SXM; the interpreter's tests take that too)."""
    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


@triton.jit
def _window_start(length, window):
    """The first position a row of ``length`` keys attends to: ``length - window``, at least 0 (no window: the host
    passes :data:`NO_WINDOW`)."""
    return tl.maximum(length - window, 0)


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, INTERPRETED: tl.constexpr):
    if INTERPRETED:  # see _INTERPRETED
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _attend_tile(q, k_base, v_base, table, tile, end, first, scale, softcap, running_max, running_sum, acc, dims,
                 stride_kb, stride_kt, stride_vb, stride_vt, BLOCK_N: tl.constexpr, PAGE: tl.constexpr,
                 PRECISION: tl.constexpr, SOFTCAP: tl.constexpr, KV_TOGETHER: tl.constexpr, UNROLLED: tl.constexpr,
                 INTERPRETED: tl.constexpr):
    """One tile of ``BLOCK_N`` positions from ``tile`` folded into the running softmax (max, sum, ``acc``
    ``[BLOCK_G, D]``); positions outside ``[first, end)`` load nothing and weigh nothing."""
    positions = tile + tl.arange(0, BLOCK_N)
    live = (positions < end) & (positions >= first)
    blocks = tl.load(table + positions // PAGE, mask=live, other=0).to(tl.int64)
    offsets = positions % PAGE
    if UNROLLED:  # the first kernel's load, as it was (the baseline)
        k_t = tl.trans(tl.load(k_base + blocks[:, None] * stride_kb + offsets[:, None] * stride_kt + dims[None, :],
                               mask=live[:, None], other=0.0))
    else:  # K^T ``[D, BLOCK_N]`` (the same bytes, D contiguous): a dot operand as loaded, which the pipeliner
        # multi-buffers in shared memory like the values (a tl.trans of a [BLOCK_N, D] load it leaves in registers)
        k_t = tl.load(k_base + blocks[None, :] * stride_kb + offsets[None, :] * stride_kt + dims[:, None],
                      mask=live[None, :], other=0.0)
    if KV_TOGETHER:  # both reads in flight while the scores are computed
        v = tl.load(v_base + blocks[:, None] * stride_vb + offsets[:, None] * stride_vt + dims[None, :],
                    mask=live[:, None], other=0.0)
    scores = _dot(q, k_t, PRECISION, INTERPRETED) * scale
    if SOFTCAP:  # Gemma 2: c tanh(s / c), tanh(x) = 2 sigmoid(2x) - 1 (saturates to +-1, no inf / inf)
        scores = softcap * (2.0 * tl.sigmoid(scores * (2.0 / softcap)) - 1.0)
    scores = tl.where(live[None, :], scores, float("-inf"))
    new_max = tl.maximum(running_max, tl.max(scores, 1))
    # A tile wholly before the window start leaves the max at -inf: subtract 0 there, not -inf (NaN).
    shift = tl.where(new_max == float("-inf"), 0.0, new_max)
    rescale = tl.exp(running_max - shift)
    weights = tl.exp(scores - shift[:, None])
    running_sum = running_sum * rescale + tl.sum(weights, 1)
    if not KV_TOGETHER:
        v = tl.load(v_base + blocks[:, None] * stride_vb + offsets[:, None] * stride_vt + dims[None, :],
                    mask=live[:, None], other=0.0)
    acc = acc * rescale[:, None] + _dot(weights.to(v.dtype), v, PRECISION, INTERPRETED)
    return new_max, running_sum, acc


@triton.jit
def _split_kernel(Q, K, V, Lengths, Tables, PartOut, PartLse, Out, Sinks, scale, window, softcap,
                  stride_qn, stride_qh, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
                  stride_tn, stride_pn, stride_ph, stride_ps, stride_ln, stride_lh, stride_on, stride_oh,
                  GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                  SPLIT_LEN: tl.constexpr, PAGE: tl.constexpr, PRECISION: tl.constexpr, SOFTCAP: tl.constexpr,
                  SINKS: tl.constexpr, NUM_STAGES: tl.constexpr, KV_TOGETHER: tl.constexpr, UNROLLED: tl.constexpr,
                  DIRECT: tl.constexpr, INTERPRETED: tl.constexpr):
    row, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    length = tl.load(Lengths + row).to(tl.int32)
    first = _window_start(length, window)
    start = split * SPLIT_LEN
    if start >= length or start + SPLIT_LEN <= first:
        return  # the combine kernel never reads this split (one split a row always has a key)
    group = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + group
    in_group = group < GROUP
    q = tl.load(Q + row * stride_qn + heads[:, None] * stride_qh + dims[None, :], mask=in_group[:, None], other=0.0)
    k_base = K + kv_head * stride_kh
    v_base = V + kv_head * stride_vh
    table = Tables + row * stride_tn
    running_max = tl.full([BLOCK_G], float("-inf"), tl.float32)
    running_sum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    end = tl.minimum(start + SPLIT_LEN, length)
    if UNROLLED:
        for block in tl.static_range(SPLIT_LEN // BLOCK_N):  # tiles past `end` load nothing (masked)
            running_max, running_sum, acc = _attend_tile(
                q, k_base, v_base, table, start + block * BLOCK_N, end, first, scale, softcap, running_max,
                running_sum, acc, dims, stride_kb, stride_kt, stride_vb, stride_vt, BLOCK_N, PAGE, PRECISION,
                SOFTCAP, KV_TOGETHER, UNROLLED, INTERPRETED)
    else:
        lowest = tl.maximum(start, first // BLOCK_N * BLOCK_N)  # the live tiles only, still BLOCK_N-aligned
        if INTERPRETED:  # see _INTERPRETED
            tile = lowest
            while tile < end:
                running_max, running_sum, acc = _attend_tile(
                    q, k_base, v_base, table, tile, end, first, scale, softcap, running_max, running_sum, acc, dims,
                    stride_kb, stride_kt, stride_vb, stride_vt, BLOCK_N, PAGE, PRECISION, SOFTCAP, KV_TOGETHER,
                    UNROLLED, INTERPRETED)
                tile += BLOCK_N
        else:
            for tile in tl.range(lowest, end, BLOCK_N, num_stages=NUM_STAGES):
                running_max, running_sum, acc = _attend_tile(
                    q, k_base, v_base, table, tile, end, first, scale, softcap, running_max, running_sum, acc, dims,
                    stride_kb, stride_kt, stride_vb, stride_vt, BLOCK_N, PAGE, PRECISION, SOFTCAP, KV_TOGETHER,
                    UNROLLED, INTERPRETED)
    if DIRECT:  # the whole row in this program: its output, no partials
        out = acc / running_sum[:, None]
        if SINKS:
            out = out * _sink_share(running_max + tl.log(running_sum), tl.load(Sinks + heads, mask=in_group, other=0.0))[:, None]
        out_ptr = Out + row * stride_on + heads[:, None] * stride_oh + dims[None, :]
        tl.store(out_ptr, out.to(Out.dtype.element_ty), mask=in_group[:, None])
    else:
        out_ptr = PartOut + row * stride_pn + heads[:, None] * stride_ph + split * stride_ps + dims[None, :]
        tl.store(out_ptr, acc / running_sum[:, None], mask=in_group[:, None])
        tl.store(PartLse + row * stride_ln + heads * stride_lh + split, running_max + tl.log(running_sum),
                 mask=in_group)


@triton.jit
def _sink_share(lse, sink):
    """The keys' share of a softmax whose denominator also holds ``exp(sink)`` (gpt-oss's attention sinks: one learned
    logit a head, dropped after): ``e^lse / (e^lse + e^sink) = sigmoid(lse - sink)`` for keys' log-sum-exp ``lse``."""
    return tl.sigmoid(lse - sink.to(tl.float32))


@triton.jit
def _combine_kernel(PartOut, PartLse, Out, Lengths, Sinks, window, stride_pn, stride_ph, stride_ps, stride_ln,
                    stride_lh, stride_on, stride_oh, HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr,
                    SPLIT_LEN: tl.constexpr, SINKS: tl.constexpr):
    row, head = tl.program_id(0), tl.program_id(1)
    length = tl.load(Lengths + row).to(tl.int32)
    splits = tl.arange(0, SPLITS)
    dims = tl.arange(0, HEAD_DIM)
    first = _window_start(length, window)
    used = (splits * SPLIT_LEN < length) & ((splits + 1) * SPLIT_LEN > first)  # never read a split not written
    lse = tl.load(PartLse + row * stride_ln + head * stride_lh + splits, mask=used, other=float("-inf"))
    weights = tl.exp(lse - tl.max(lse, 0))
    total = tl.sum(weights, 0)
    weights = weights / total
    parts = tl.load(PartOut + row * stride_pn + head * stride_ph + splits[:, None] * stride_ps + dims[None, :],
                    mask=used[:, None], other=0.0)
    out = tl.sum(parts * weights[:, None], 0)
    if SINKS:
        out = out * _sink_share(tl.max(lse, 0) + tl.log(total), tl.load(Sinks + head))
    tl.store(Out + row * stride_on + head * stride_oh + dims, out.to(Out.dtype.element_ty))


def supported(*, head_dim: int, device: torch.device) -> bool:
    """Whether these kernels run here: CUDA, and a power-of-two head size (``tl.arange``)."""
    return torch.device(device).type == "cuda" and head_dim >= 16 and head_dim & (head_dim - 1) == 0


def paged_decode_attention(*, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor,
                           scale: float, block_tables: torch.Tensor, window: int | None = None,
                           softcap: float | None = None, sinks: torch.Tensor | None = None,
                           config: DecodeConfig | None = None) -> torch.Tensor:
    """``softmax(cap(scale q k^T)) v``: attention of ``q`` ``[N, H, D]`` over the first ``lengths[n]`` positions of
    row ``n``'s blocks (``block_tables`` ``[N, W]``, ``keys`` / ``values`` ``[KV, blocks, B, D]``; with a sliding
    ``window``, only the last ``window`` of them: splits wholly before the window are skipped), ``cap(s) = c tanh(s /
    c)`` with a ``softcap`` ``c`` (Gemma 2), else ``s``; ``sinks`` ``[H]`` (gpt-oss): each head's logit joins its
    softmax's denominator and has no value; returns ``[N, H, D]``.
    Launches a fixed grid (graph-safe): ``config`` (default :func:`choose_config` of the static shapes)."""
    if softcap is not None and softcap <= 0:
        raise ValueError(f"softcap must be > 0 (or None for no cap), got {softcap}")
    rows, heads, head_dim = q.shape
    if sinks is not None and tuple(sinks.shape) != (heads,):
        raise ValueError(f"paged decode attention: sinks of shape {tuple(sinks.shape)}, expected ({heads},)")
    kv_heads, page = keys.shape[0], keys.shape[2]
    group = heads // kv_heads
    span = block_tables.shape[1] * page
    if config is None:
        config = choose_config(rows=rows, heads=heads, kv_heads=kv_heads, head_dim=head_dim, page=page,
                               width=block_tables.shape[1], dtype=q.dtype, sms=_sm_count(q.device))
    if config.split_len % config.block_n:
        raise ValueError(f"split_len {config.split_len} must be a multiple of block_n {config.block_n}")
    splits = config.splits(span)
    direct = splits == 1
    out = torch.empty_like(q)
    part_out = out if direct else torch.empty(rows, heads, splits, head_dim, dtype=torch.float32, device=q.device)
    part_lse = out if direct else torch.empty(rows, heads, splits, dtype=torch.float32, device=q.device)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"  # tf32 applies to fp32 operands only
    _split_kernel[(rows, kv_heads, splits)](
        q, keys, values, lengths, block_tables, part_out, part_lse, out, q if sinks is None else sinks, scale,
        window or NO_WINDOW, softcap or 1.0,
        q.stride(0), q.stride(1), keys.stride(1), keys.stride(0), keys.stride(2),
        values.stride(1), values.stride(0), values.stride(2), block_tables.stride(0),
        part_out.stride(0), part_out.stride(1), part_out.stride(2) if not direct else 0, part_lse.stride(0),
        part_lse.stride(1), out.stride(0), out.stride(1),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim, BLOCK_N=config.block_n,
        SPLIT_LEN=config.split_len, PAGE=page, PRECISION=precision, SOFTCAP=softcap is not None,
        SINKS=sinks is not None, NUM_STAGES=config.num_stages, KV_TOGETHER=config.kv_together,
        UNROLLED=config.unrolled, DIRECT=direct,
        INTERPRETED=_INTERPRETED, num_warps=config.num_warps, num_stages=config.num_stages,
    )
    if not direct:
        _combine_kernel[(rows, heads)](
            part_out, part_lse, out, lengths, q if sinks is None else sinks, window or NO_WINDOW, part_out.stride(0),
            part_out.stride(1), part_out.stride(2), part_lse.stride(0), part_lse.stride(1), out.stride(0),
            out.stride(1), HEAD_DIM=head_dim, SPLITS=triton.next_power_of_2(splits), SPLIT_LEN=config.split_len,
            SINKS=sinks is not None,
        )
    return out

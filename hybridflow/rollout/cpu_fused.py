"""The CPU decode step's small ops and its sampler as C kernels (``csrc/decode_ops.c``, ``csrc/sample_rows.c``).

The CPU counterparts of :mod:`hybridflow.rollout.triton_fused` and :mod:`hybridflow.rollout.triton_sampling`, with
their signatures, so that one fused decode step (:meth:`LlamaFamilyDecoder._decode_fused`) runs on either device.
Why: at a decode step's sizes (``[N, 576]`` for SmolLM2) a torch op costs a few microseconds of dispatch for well
under one of work, an eager layer is ~30 of them, and two decode lanes' dispatches also queue for the GIL; the
sampler's five passes over ``[N, V]`` were ~6 ms of a 32-row lane. Here a layer is its matmuls, the attention kernel
and four calls (six with Gemma's norms of the sub-block outputs; a mixture-of-experts MLP stays torch ops), and a row
is sampled in two passes over its logits (docs/benchmarks.md has the measurements).

The decode step's kernels take fp32 or bf16 CPU tensors (every tensor of one call in the same dtype: the engine's; bf16
is computed in fp32 and rounded once where stored), the sampler fp32 logits; each runs on the calling thread (the
sampler on ``torch.get_num_threads()`` threads from 16 rows); :func:`available` says whether the library is built.
"""

from __future__ import annotations

import torch

from hybridflow.rollout.cpu_kernels import library


def available() -> bool:
    """Whether the C kernels are built (:func:`hybridflow.rollout.cpu_kernels.library`)."""
    return library() is not None


def _pointer(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def _contiguous_f32(tensor: torch.Tensor, name: str) -> torch.Tensor:
    return _contiguous_as(tensor, name, torch.float32)


SUFFIXES = {torch.float32: "f32", torch.bfloat16: "bf16"}
"""The C kernel of each dtype the decode step's kernels take (issue 56: bf16 beside fp32)."""


def _kernel(name: str, tensor: torch.Tensor):
    """The C function ``name`` for ``tensor``'s dtype (``{name}_f32`` or ``{name}_bf16``)."""
    if tensor.dtype not in SUFFIXES or tensor.device.type != "cpu":
        raise ValueError(f"{name}: the CPU kernels take fp32 or bf16 CPU tensors, not {tensor.dtype} on "
                         f"{tensor.device}")
    return getattr(library(), f"{name}_{SUFFIXES[tensor.dtype]}")


def _contiguous_as(tensor: torch.Tensor, name: str, dtype: torch.dtype) -> torch.Tensor:
    """``tensor`` contiguous, refused unless a CPU tensor of the call's ``dtype``."""
    if tensor.dtype != dtype or tensor.device.type != "cpu":
        raise ValueError(f"{name}: {tensor.dtype} on {tensor.device}, expected the call's {dtype} on cpu (the CPU "
                         f"kernels take one dtype a call: fp32, bf16 for the decode step's)")
    return tensor.contiguous()


def _check_shapes(kernel: str, **shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    """Each ``name=(shape, expected)`` must match: the C kernels trust their shapes, so a mismatch is refused here
    rather than read or written out of bounds. ``-1`` in ``expected`` takes any size."""
    for name, (shape, expected) in shapes.items():
        if shape == expected:  # the usual case, without the generator below (~1 us a call, 120 calls a step)
            continue
        if len(shape) != len(expected) or any(e not in (-1, s) for s, e in zip(shape, expected)):
            raise ValueError(f"{kernel}: {name} has shape {tuple(shape)}, expected {tuple(expected)} (-1: any)")


def add_rms_norm(*, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float, unit_offset: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = x + residual`` (or ``x`` alone) and ``weight * RMSNorm(h)`` (``unit_offset``: ``(1 + weight)``,
    Gemma's); returns ``(normed, h)``, each ``[N, C]``."""
    kernel = _kernel("add_rms_norm", x)
    x = x.contiguous()
    residual = None if residual is None else _contiguous_as(residual, "residual", x.dtype)
    weight = _contiguous_as(weight, "weight", x.dtype)
    rows, columns = x.shape
    _check_shapes("add_rms_norm", weight=(weight.shape, (columns,)),
                  residual=(x.shape if residual is None else residual.shape, (rows, columns)))
    normed = torch.empty_like(x)
    summed = torch.empty_like(x) if residual is not None else x
    kernel(x.data_ptr(), _pointer(residual), weight.data_ptr(), normed.data_ptr(),
                               summed.data_ptr(), rows, columns, eps, unit_offset)
    return normed, summed


def qkv_rope_write(*, qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   qk_norm: torch.Tensor | None, keys: torch.Tensor, values: torch.Tensor, heads: int,
                   eps: float, block_tables: torch.Tensor, rope_positions: torch.Tensor | None = None,
                   unit_offset: bool = False) -> torch.Tensor:
    """Rotate (and, given ``qk_norm`` ``[H + KV, D]``, first normalise; ``unit_offset``: by ``1 + qk_norm``, Gemma 3)
    the heads of ``qkv``
    ``[N, (H + 2 KV) * D]``; write k and v into the paged ``keys`` / ``values`` ``[KV, blocks, B, D]`` at
    ``positions`` ``[N]`` (block ``block_tables[n, p // B]`` ``[N, W]`` int32, offset ``p % B``); return q
    ``[N, H, D]``. ``cos`` / ``sin``: ``[T, R]`` tables indexed by ``rope_positions`` ``[N]`` (each at most its
    row's position; ``None``: ``positions``), turning a head's first ``R`` dimensions (``R < D``: GLM-4.5's partial
    rotary; the rest pass as they are); in ``qkv``'s dtype, or fp32 with bf16 ``qkv`` (OLMo 3). A position past the table or the rotary table, a rotation past its
    row's position, or a block id outside the pool, is refused before anything is written."""
    kernel = _kernel("qkv_rope_write", qkv)
    tables_f32 = qkv.dtype == torch.bfloat16 and cos.dtype == torch.float32  # OLMo 3's fp32 tables: read as they are
    table_dtype = torch.float32 if tables_f32 else qkv.dtype
    table_flag = (tables_f32,) if qkv.dtype == torch.bfloat16 else ()  # the bf16 kernel's last argument
    qkv, cos, sin = (_contiguous_as(t, name, dtype) for t, name, dtype in
                     ((qkv, "qkv", qkv.dtype), (cos, "cos", table_dtype), (sin, "sin", table_dtype)))
    qk_norm = None if qk_norm is None else _contiguous_as(qk_norm, "qk_norm", qkv.dtype)
    if keys.dtype != qkv.dtype or values.dtype != qkv.dtype:
        raise ValueError(f"qkv_rope_write: a pool of {keys.dtype} / {values.dtype} for {qkv.dtype} qkv: the pool "
                         "holds the engine's dtype")
    if not (keys.is_contiguous() and values.is_contiguous()):
        raise ValueError("keys and values must be contiguous layers of the pool")
    positions = positions.to(torch.int64).contiguous()
    rope_positions = None if rope_positions is None else rope_positions.to(torch.int64).contiguous()
    if block_tables.stride(1) != 1 or block_tables.dtype != torch.int32:
        block_tables = block_tables.to(torch.int32).contiguous()
    rows = qkv.shape[0]
    kv_heads, blocks, block_size, head_dim = keys.shape
    _check_shapes("qkv_rope_write", qkv=(qkv.shape, (rows, (heads + 2 * kv_heads) * head_dim)),
                  values=(values.shape, keys.shape), positions=(positions.shape, (rows,)),
                  cos=(cos.shape, (-1, -1)), sin=(sin.shape, cos.shape),
                  qk_norm=((heads + kv_heads, head_dim) if qk_norm is None else qk_norm.shape,
                           (heads + kv_heads, head_dim)),
                  block_tables=(block_tables.shape[:1], (rows,)),
                  rope_positions=((rows,) if rope_positions is None else rope_positions.shape, (rows,)))
    if cos.shape[1] % 2 or cos.shape[1] > head_dim:
        raise ValueError(f"qkv_rope_write: rotary tables {cos.shape[1]} wide, expected an even width up to the head "
                         f"dim {head_dim}")
    q = torch.empty(rows, heads, head_dim, dtype=qkv.dtype)
    max_length = min(cos.shape[0], block_tables.shape[1] * block_size)
    failed = kernel(
        qkv.data_ptr(), positions.data_ptr(), _pointer(rope_positions), cos.data_ptr(), sin.data_ptr(), _pointer(qk_norm), q.data_ptr(),
        keys.data_ptr(), values.data_ptr(), rows, heads, block_tables.data_ptr(), block_tables.stride(0), kv_heads,
        head_dim, cos.shape[1], blocks, block_size, max_length, eps, unit_offset, *table_flag)
    if failed:
        raise RuntimeError(f"qkv_rope_write refused its inputs (head dim {head_dim}, positions up to "
                           f"{int(positions.max())} of {max_length}, or a block id outside the pool of {blocks})")
    return q


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up`` ``[N, 2 I]`` (gate first); returns ``[N, I]``."""
    return _gated(gate_up, "silu_mul")


def gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``gelu_tanh(gate) * up`` (GeGLU, HF's ``gelu_pytorch_tanh``) for ``gate_up`` ``[N, 2 I]`` (gate first);
    returns ``[N, I]``."""
    return _gated(gate_up, "gelu_tanh_mul")


def _gated(gate_up: torch.Tensor, kernel: str) -> torch.Tensor:
    """``act(gate) * up`` by the C kernel ``{kernel}_f32`` / ``_bf16``: ``[N, 2 I]`` -> ``[N, I]``."""
    function = _kernel(kernel, gate_up)
    gate_up = gate_up.contiguous()
    rows, inner = gate_up.shape[0], gate_up.shape[1] // 2
    _check_shapes(kernel, gate_up=(gate_up.shape, (rows, 2 * inner)))
    out = torch.empty(rows, inner, dtype=gate_up.dtype)
    function(gate_up.data_ptr(), out.data_ptr(), rows, inner)
    return out


def sample_rows(*, logits: torch.Tensor, temperature: torch.Tensor, greedy: torch.Tensor,
                uniform: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens [N] int64, logprobs [N] fp32)`` for fp32 ``logits`` ``[N, V]``, per-row ``temperature`` ``[N]``
    (1 on greedy rows), ``greedy`` ``[N]`` bool and ``uniform`` ``[N, 1]``."""
    logits = _contiguous_f32(logits, "logits")
    temperature, uniform = (_contiguous_f32(t, name) for t, name in ((temperature, "temperature"),
                                                                     (uniform, "uniform")))
    greedy = greedy.to(torch.bool).contiguous()
    rows, vocab = logits.shape
    _check_shapes("sample_rows", logits=(logits.shape, (rows, max(vocab, 1))), temperature=(temperature.shape, (rows,)),
                  greedy=(greedy.shape, (rows,)), uniform=(uniform.reshape(-1).shape, (rows,)))
    tokens = torch.empty(rows, dtype=torch.int64)
    logprobs = torch.empty(rows, dtype=torch.float32)
    failed = library().sample_rows_f32(logits.data_ptr(), temperature.data_ptr(), greedy.data_ptr(),
                                       uniform.data_ptr(), tokens.data_ptr(), logprobs.data_ptr(), rows, vocab,
                                       torch.get_num_threads())
    if failed:
        raise MemoryError(f"sample_rows: no scratch memory for a row of {vocab} logits")
    return tokens, logprobs

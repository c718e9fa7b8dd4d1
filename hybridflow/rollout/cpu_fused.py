"""The CPU decode step's small ops and its sampler as C kernels (``csrc/decode_ops.c``, ``csrc/sample_rows.c``).

The CPU counterparts of :mod:`hybridflow.rollout.triton_fused` and :mod:`hybridflow.rollout.triton_sampling`, with
their signatures, so that one fused decode step (:meth:`LlamaFamilyDecoder._decode_fused`) runs on either device.
Why: at a decode step's sizes (``[N, 576]`` for SmolLM2) a torch op costs a few microseconds of dispatch for well
under one of work, an eager layer is ~30 of them, and two decode lanes' dispatches also queue for the GIL; the
sampler's five passes over ``[N, V]`` were ~6 ms of a 32-row lane. Here a layer is its matmuls, the attention kernel
and four calls (six with Gemma's norms of the sub-block outputs; a mixture-of-experts MLP stays torch ops), and a row
is sampled in two passes over its logits (docs/benchmarks.md has the measurements).

Every function takes fp32 CPU tensors (the engine's CPU dtype) and runs on the calling thread (the sampler on
``torch.get_num_threads()`` threads from 16 rows); :func:`available` says whether the library is built.
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
    if tensor.dtype != torch.float32 or tensor.device.type != "cpu":
        raise ValueError(f"{name}: the CPU kernels take fp32 CPU tensors, not {tensor.dtype} on {tensor.device}")
    return tensor.contiguous()


def _check_shapes(kernel: str, **shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    """Each ``name=(shape, expected)`` must match: the C kernels trust their shapes, so a mismatch is refused here
    rather than read or written out of bounds. ``-1`` in ``expected`` takes any size."""
    for name, (shape, expected) in shapes.items():
        if len(shape) != len(expected) or any(e not in (-1, s) for s, e in zip(shape, expected)):
            raise ValueError(f"{kernel}: {name} has shape {tuple(shape)}, expected {tuple(expected)} (-1: any)")


def add_rms_norm(*, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float, unit_offset: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = x + residual`` (or ``x`` alone) and ``weight * RMSNorm(h)`` (``unit_offset``: ``(1 + weight)``,
    Gemma's); returns ``(normed, h)``, each ``[N, C]``."""
    x = _contiguous_f32(x, "x")
    residual = None if residual is None else _contiguous_f32(residual, "residual")
    weight = _contiguous_f32(weight, "weight")
    rows, columns = x.shape
    _check_shapes("add_rms_norm", weight=(weight.shape, (columns,)),
                  residual=(x.shape if residual is None else residual.shape, (rows, columns)))
    normed = torch.empty_like(x)
    summed = torch.empty_like(x) if residual is not None else x
    library().add_rms_norm_f32(x.data_ptr(), _pointer(residual), weight.data_ptr(), normed.data_ptr(),
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
    rotary; the rest pass as they are). A position past the table or the rotary table, a rotation past its
    row's position, or a block id outside the pool, is refused before anything is written."""
    qkv, cos, sin = (_contiguous_f32(t, name) for t, name in ((qkv, "qkv"), (cos, "cos"), (sin, "sin")))
    qk_norm = None if qk_norm is None else _contiguous_f32(qk_norm, "qk_norm")
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
    failed = library().qkv_rope_write_f32(
        qkv.data_ptr(), positions.data_ptr(), _pointer(rope_positions), cos.data_ptr(), sin.data_ptr(), _pointer(qk_norm), q.data_ptr(),
        keys.data_ptr(), values.data_ptr(), rows, heads, block_tables.data_ptr(), block_tables.stride(0), kv_heads,
        head_dim, cos.shape[1], blocks, block_size, max_length, eps, unit_offset)
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
    """``act(gate) * up`` by the C kernel ``{kernel}_f32``: ``[N, 2 I]`` -> ``[N, I]``."""
    gate_up = _contiguous_f32(gate_up, "gate_up")
    rows, inner = gate_up.shape[0], gate_up.shape[1] // 2
    _check_shapes(kernel, gate_up=(gate_up.shape, (rows, 2 * inner)))
    out = torch.empty(rows, inner, dtype=gate_up.dtype)
    getattr(library(), f"{kernel}_f32")(gate_up.data_ptr(), out.data_ptr(), rows, inner)
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

"""The decode step's small ops fused into three Triton kernels (CUDA; CPU tests run them interpreted).

An eager decoder layer launches about 35 kernels, most of them elementwise passes over a few
kilobytes per row: RMSNorm alone is seven (cast, square, mean, rsqrt, scale, cast, weight), the
rotary embedding five, the cache write four. At a decode step's sizes each costs its launch and a
few microseconds however little it does, so a 28-layer model spends milliseconds a step on them
even inside a CUDA graph. Here a layer is ten kernels: the four matmuls, the two attention
kernels, and

- :func:`add_rms_norm`: the residual add and the next RMSNorm (Zhang & Sennrich 2019), one pass;
- :func:`qkv_rope_write`: per head of the fused q|k|v projection, Qwen3's q/k RMSNorm, the rotary
  embedding (Su et al. 2021, HF's rotate-half layout; on the head's first dimensions only for GLM-4.5) and, for k and v, the write into the paged
  cache at the row's position; q comes out ``[N, H, D]`` for attention;
- :func:`silu_mul`: SwiGLU's ``silu(gate) * up`` (Shazeer 2020); :func:`gelu_tanh_mul`: GeGLU's
  ``gelu_tanh(gate) * up`` (Gemma).

Gemma's norms (``unit_offset``) scale by ``1 + w``, and each sub-block's output is normalised before
its residual add (one more :func:`add_rms_norm` without a residual, two a layer).

Rounding follows HF's modules: norms and the activation are computed in fp32 and cast back to the
model dtype where HF casts (Llama's ``weight * normed.to(dtype)``, Gemma's ``(normed * (1 + weight)).to(dtype)``,
``silu(gate).to(dtype) * up``); the
residual add rounds to the model dtype as HF's does. The rotation is computed in fp32 and rounded
once (HF rounds each product in bf16), so bf16 results differ from HF's by bf16 rounding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rms_norm_kernel(X, Residual, Weight, Out, ResidualOut, eps, stride_x, stride_r, stride_o, stride_ro,
                         COLUMNS: tl.constexpr, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                         UNIT_OFFSET: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < COLUMNS
    x = tl.load(X + row * stride_x + cols, mask=inside, other=0.0)
    if HAS_RESIDUAL:
        residual = tl.load(Residual + row * stride_r + cols, mask=inside, other=0.0)
        x = (x.to(tl.float32) + residual.to(tl.float32)).to(residual.dtype)
        tl.store(ResidualOut + row * stride_ro + cols, x, mask=inside)
    wide = x.to(tl.float32)
    inverse_rms = 1.0 / tl.sqrt(tl.sum(wide * wide, 0) / COLUMNS + eps)
    weight = tl.load(Weight + cols, mask=inside, other=0.0).to(tl.float32)
    if UNIT_OFFSET:  # Gemma: (1 + w) in fp32, one cast after
        tl.store(Out + row * stride_o + cols, (wide * inverse_rms * (1.0 + weight)).to(x.dtype), mask=inside)
    else:  # Llama: w * normed.to(dtype)
        normed = (wide * inverse_rms).to(x.dtype).to(tl.float32)
        tl.store(Out + row * stride_o + cols, (weight * normed).to(x.dtype), mask=inside)


def add_rms_norm(*, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float, unit_offset: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = x + residual`` (or ``x`` alone) and ``weight * RMSNorm(h)`` (``unit_offset``: ``(1 + weight)``,
    Gemma's); returns ``(normed, h)``, each ``[N, C]``."""
    rows, columns = x.shape
    out = torch.empty_like(x)
    summed = torch.empty_like(x) if residual is not None else x
    _add_rms_norm_kernel[(rows,)](
        x, residual if residual is not None else x, weight, out, summed, eps,
        x.stride(0), (residual if residual is not None else x).stride(0), out.stride(0), summed.stride(0),
        COLUMNS=columns, BLOCK=triton.next_power_of_2(columns), HAS_RESIDUAL=residual is not None,
        UNIT_OFFSET=unit_offset,
    )
    return out, summed


@triton.jit
def _qkv_rope_write_kernel(QKV, Positions, RopePositions, Cos, Sin, NormWeight, QOut, Keys, Values, Tables,
                           eps, stride_qkv, stride_qo_n, stride_qo_h, stride_cos,
                           stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt, stride_tn,
                           HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                           ROTARY_DIM: tl.constexpr, PAGE: tl.constexpr, HAS_NORM: tl.constexpr,
                           UNIT_OFFSET: tl.constexpr):
    row, head = tl.program_id(0), tl.program_id(1)
    position = tl.load(Positions + row)
    block = tl.load(Tables + row * stride_tn + position // PAGE).to(tl.int64)
    offset = position % PAGE
    source = QKV + row * stride_qkv + head * HEAD_DIM
    if head >= HEADS + KV_HEADS:  # a value head: into the cache as it is
        dims = tl.arange(0, HEAD_DIM)
        value_head = head - HEADS - KV_HEADS
        target = Values + block * stride_vb + value_head * stride_vh + offset * stride_vt
        tl.store(target + dims, tl.load(source + dims))
        return
    # Each value beside its rotate-half partner (i + R/2 for the first half of the rotary part, i - R/2 for the
    # second; itself past the rotary part: GLM-4.5's partial rotary, where cos 1 and sin 0 leave it as it is).
    dims = tl.arange(0, HEAD_DIM)
    turned = dims < ROTARY_DIM
    partners = tl.where(dims < ROTARY_DIM // 2, dims + ROTARY_DIM // 2, tl.where(turned, dims - ROTARY_DIM // 2, dims))
    x = tl.load(source + dims)
    dtype = x.dtype
    x = x.to(tl.float32)
    partner = tl.load(source + partners).to(tl.float32)
    if HAS_NORM:  # Qwen3: RMSNorm over the head, weight * normed.to(dtype); Gemma 3: normed * (1 + weight), cast
        inverse_rms = 1.0 / tl.sqrt(tl.sum(x * x, 0) / HEAD_DIM + eps)
        weights = NormWeight + head * HEAD_DIM
        weight = tl.load(weights + dims).to(tl.float32)
        partner_weight = tl.load(weights + partners).to(tl.float32)
        if UNIT_OFFSET:
            x = x * inverse_rms * (1.0 + weight)
            partner = partner * inverse_rms * (1.0 + partner_weight)
        else:
            x = weight * (x * inverse_rms).to(dtype).to(tl.float32)
            partner = partner_weight * (partner * inverse_rms).to(dtype).to(tl.float32)
        x, partner = x.to(dtype).to(tl.float32), partner.to(dtype).to(tl.float32)
    rope_position = tl.load(RopePositions + row)  # a vision-language row rotates at position + delta
    cos = tl.load(Cos + rope_position * stride_cos + dims, mask=turned, other=1.0).to(tl.float32)
    sin = tl.load(Sin + rope_position * stride_cos + dims, mask=turned, other=0.0).to(tl.float32)
    rotated = (x * cos + tl.where(dims < ROTARY_DIM // 2, -partner, partner) * sin).to(dtype)
    if head < HEADS:
        target = QOut + row * stride_qo_n + head * stride_qo_h
    else:
        target = Keys + block * stride_kb + (head - HEADS) * stride_kh + offset * stride_kt
    tl.store(target + dims, rotated)


def qkv_rope_write(*, qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   qk_norm: torch.Tensor | None, keys: torch.Tensor, values: torch.Tensor, heads: int,
                   eps: float, block_tables: torch.Tensor, rope_positions: torch.Tensor | None = None,
                   unit_offset: bool = False) -> torch.Tensor:
    """Rotate (and, given ``qk_norm`` ``[H + KV, D]``, first normalise; ``unit_offset``: by ``1 + qk_norm``, Gemma 3)
    the heads of ``qkv``
    ``[N, (H + 2 KV) * D]``; write k and v into the paged ``keys`` / ``values`` ``[KV, blocks, B, D]`` at
    ``positions`` ``[N]`` (block ``block_tables[n, p // B]`` ``[N, W]``, offset ``p % B``); return q
    ``[N, H, D]``. ``cos`` / ``sin``: ``[T, R]`` tables indexed by ``rope_positions`` ``[N]`` (``None``:
    ``positions``), turning a head's first ``R`` dimensions (``R < D``: GLM-4.5's partial rotary)."""
    rows = qkv.shape[0]
    kv_heads, page, head_dim = keys.shape[0], keys.shape[2], keys.shape[3]
    if cos.shape[1] % 2 or cos.shape[1] > head_dim or cos.stride(1) != 1 or sin.stride() != cos.stride():
        raise ValueError(f"qkv_rope_write: rotary tables {tuple(cos.shape)} (strides {cos.stride()}, "
                         f"{sin.stride()}), expected an even width up to the head dim {head_dim}, rows contiguous")
    q = torch.empty(rows, heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    _qkv_rope_write_kernel[(rows, heads + 2 * kv_heads)](
        qkv, positions, positions if rope_positions is None else rope_positions, cos, sin, qk_norm if qk_norm is not None else cos, q, keys, values, block_tables, eps,
        qkv.stride(0), q.stride(0), q.stride(1), cos.stride(0),
        keys.stride(1), keys.stride(0), keys.stride(2), values.stride(1), values.stride(0), values.stride(2),
        block_tables.stride(0),
        HEADS=heads, KV_HEADS=kv_heads, HEAD_DIM=head_dim, ROTARY_DIM=cos.shape[1], PAGE=page, HAS_NORM=qk_norm is not None,
        UNIT_OFFSET=unit_offset,
    )
    return q


@triton.jit
def _gated_kernel(GateUp, Out, stride_in, stride_out, COLUMNS: tl.constexpr, BLOCK: tl.constexpr,
                  GELU_TANH: tl.constexpr):
    row, block = tl.program_id(0), tl.program_id(1)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    inside = cols < COLUMNS
    gate = tl.load(GateUp + row * stride_in + cols, mask=inside, other=0.0)
    up = tl.load(GateUp + row * stride_in + COLUMNS + cols, mask=inside, other=0.0)
    wide = gate.to(tl.float32)
    if GELU_TANH:  # x / 2 (1 + tanh(y)) = x / (1 + exp(-2 y)), y = sqrt(2 / pi) (x + 0.044715 x^3)
        activated = (wide / (1.0 + tl.exp(-1.5957691216057308 * (wide + 0.044715 * wide * wide * wide)))).to(gate.dtype)
    else:  # silu
        activated = (wide / (1.0 + tl.exp(-wide))).to(gate.dtype)
    tl.store(Out + row * stride_out + cols, (activated.to(tl.float32) * up.to(tl.float32)).to(gate.dtype), mask=inside)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up`` ``[N, 2 I]`` (gate first); returns ``[N, I]``."""
    return _gated(gate_up, gelu_tanh=False)


def gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``gelu_tanh(gate) * up`` (GeGLU, HF's ``gelu_pytorch_tanh``) for ``gate_up`` ``[N, 2 I]`` (gate first);
    returns ``[N, I]``."""
    return _gated(gate_up, gelu_tanh=True)


def _gated(gate_up: torch.Tensor, *, gelu_tanh: bool) -> torch.Tensor:
    rows, columns = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, columns, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _gated_kernel[(rows, triton.cdiv(columns, block))](gate_up, out, gate_up.stride(0), out.stride(0),
                                                      COLUMNS=columns, BLOCK=block, GELU_TANH=gelu_tanh)
    return out

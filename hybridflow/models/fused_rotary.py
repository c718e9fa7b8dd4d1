"""HF's rotary embedding under autocast as one autograd function: no ``cat`` / ``neg`` / slice chains, same bits.

HF's ``apply_rotary_pos_emb`` computes ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = [-x2, x1]``. Under
CPU autocast its bf16 ``q`` / ``k`` meet fp32 ``cos`` / ``sin``, so the result is fp32 (cast back to bf16 by the
attention call), and the backward is a chain of small passes: two ``mul`` backwards, a ``cat`` backward, a ``neg``,
two slice backwards that each fill a zero tensor of the whole ``x`` and copy a half into it, and the adds. Here, per
half (``c1, s1`` / ``c2, s2`` the halves of ``cos`` / ``sin``):

    forward:   y1 = x1 c1 - x2 s1,            y2 = x2 c2 + x1 s2          (fp32, then the autocast dtype)
    backward:  dx1 = [g1 c1] + [g2 s2],       dx2 = [g2 c2] - [g1 s1]      ([.]: rounded to x's dtype, as HF's
                                                                           autograd rounds each product's gradient)

the same operations in the same order as HF's graph, so the same values bit for bit (the test compares both, forward
and gradients); the output comes in the autocast dtype, the dtype the attention call casts HF's fp32 result to.
Installed per modeling module by :func:`fuse_rotary` (from ``autocast_forward``), only where the module's
``apply_rotary_pos_emb`` has HF's standard signature and reproduces on a probe; outside autocast, and for partial or
odd rotary widths, the module's own function runs.
"""

from __future__ import annotations

import inspect
import sys

import torch

STANDARD_PARAMETERS = ("q", "k", "cos", "sin", "unsqueeze_dim")
"""HF's signature of ``apply_rotary_pos_emb`` (Llama, Qwen2/3, Mistral, Gemma, ...), the only one replaced."""


class RotateHalf(torch.autograd.Function):
    """``x * cos + rotate_half(x) * sin`` in fp32 (HF's arithmetic), returned in ``out_dtype``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        ctx.x_dtype = x.dtype
        # one upcast of x (a mixed-dtype op on a CPU casts its input into a temporary on every call)
        x = x.to(torch.promote_types(x.dtype, cos.dtype))
        (x1, x2), (c1, c2), (s1, s2) = halves(x), halves(cos), halves(sin)
        out = torch.empty_like(x, dtype=out_dtype)
        with torch.autocast(x.device.type, enabled=False):
            torch.sub(x1 * c1, x2 * s1, out=out[..., :x1.shape[-1]])  # fp32 result, rounded once on the store
            torch.add(x2 * c2, x1 * s2, out=out[..., x1.shape[-1]:])
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        cos, sin = ctx.saved_tensors
        dtype = ctx.x_dtype
        dx = torch.empty_like(grad, dtype=dtype)
        grad = grad.to(torch.promote_types(dtype, cos.dtype))  # HF's output gradient: in the promoted dtype
        (g1, g2), (c1, c2), (s1, s2) = halves(grad), halves(cos), halves(sin)
        with torch.autocast(grad.device.type, enabled=False):
            torch.add(rounded(g1 * c1, dtype), rounded(g2 * s2, dtype), out=dx[..., :g1.shape[-1]])
            torch.sub(rounded(g2 * c2, dtype), rounded(g1 * s1, dtype), out=dx[..., g1.shape[-1]:])
        return dx, None, None, None


def halves(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    half = tensor.shape[-1] // 2
    return tensor[..., :half], tensor[..., half:]


def rounded(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``tensor`` in ``dtype`` (the rounding HF's autograd applies to a gradient of an input of that dtype)."""
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def fused_apply_rotary(original):
    """``original`` (a module's ``apply_rotary_pos_emb``) with the fused path under autocast."""

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        device = q.device.type
        if not (torch.is_autocast_enabled(device) and q.shape[-1] == k.shape[-1] == cos.shape[-1] == sin.shape[-1]
                and q.shape[-1] % 2 == 0 and cos.dtype.is_floating_point):
            return original(q, k, cos, sin, unsqueeze_dim)
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        dtype = torch.get_autocast_dtype(device)
        return RotateHalf.apply(q, cos, sin, dtype), RotateHalf.apply(k, cos, sin, dtype)

    apply_rotary_pos_emb.hybridflow_original = original
    return apply_rotary_pos_emb


def fuse_rotary(model: torch.nn.Module) -> int:
    """Replace ``apply_rotary_pos_emb`` in the modeling module of each of ``model``'s classes that has HF's
    standard one (signature, and the same values and gradients on a probe); the number of modules changed now.
    Idempotent; the replacement is the original outside autocast."""
    changed = 0
    for name in {type(module).__module__ for module in model.modules()}:
        module = sys.modules.get(name)
        original = getattr(module, "apply_rotary_pos_emb", None)
        if original is None or hasattr(original, "hybridflow_original") or not _standard(original):
            continue
        fused = fused_apply_rotary(original)
        if reproduces(original, fused):
            module.apply_rotary_pos_emb = fused
            changed += 1
    return changed


def _standard(function) -> bool:
    try:
        return tuple(inspect.signature(function).parameters) == STANDARD_PARAMETERS
    except (TypeError, ValueError):
        return False


def reproduces(original, fused, *, dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether ``fused`` gives ``original``'s outputs (cast to the autocast dtype) and input gradients, bit for bit,
    under CPU autocast on a small random probe."""
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, 5, 8, generator=gen).to(dtype).requires_grad_() for _ in range(2))
    angles = torch.randn(1, 5, 4, generator=gen)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    upstream = [torch.randn(1, 2, 5, 8, generator=gen).to(dtype) for _ in range(2)]
    results = []
    for function in (original, fused):
        with torch.autocast("cpu", dtype=dtype):
            outs = [out.to(dtype) for out in function(q, k, cos, sin)]
        grads = torch.autograd.grad(outs, (q, k), upstream)
        results.append([*outs, *grads])
    return all(torch.equal(a, b) for a, b in zip(*results))

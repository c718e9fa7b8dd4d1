"""HF's RMSNorm and SwiGLU product under CPU autocast as autograd functions with closed-form backwards.

HF's ``LlamaRMSNorm`` (Llama, Qwen2/3, Mistral, ...) is ``weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)`` over
``x.float()``: five elementwise passes forward, and autograd's backward walks them all again (``mul`` backwards,
``rsqrt`` / ``mean`` / ``pow`` backwards, the adds: about eight passes over ``[tokens, hidden]``), keeping the
normalised ``x * r`` alive for the weight gradient. With ``r`` the row's ``rsqrt``, ``h = x r`` and ``g`` the output
gradient, ``gh = g w`` (rounded to ``x``'s dtype, as HF's gradient through ``.to(x.dtype)`` is) and ``D`` the width:

    forward:   r = rsqrt(mean(x^2) + eps),  y = w * h               (HF's operations in HF's order: the same bits)
    backward:  dx = r gh - x r^3 <gh, x> / D,   dw = sum_rows g h

For fp32 ``x`` (the residual stream of a model under autocast is fp32) ``<gh, x> = (g x) @ w`` and
``dw = r^T (g x)``: one product ``P = g x``, two matrix-vector products over it, and ``dx`` written into ``P``'s
buffer in three in-place passes; only ``x`` and ``r`` are kept. The gradients differ from HF's chain by fp32
rounding only (another summation order; the tests bound them against fp64).

HF's SwiGLU MLP is ``down(act(gate(x)) * up(x))``; :class:`SwiGLU` computes ``silu(gate) * up`` with torch's own
``silu`` / ``mul`` / ``silu_backward`` kernels, so every value, forward and backward, is HF's bit for bit (torch's
bf16 ``silu`` is the costly pass, so its output is kept, as HF keeps it, not recomputed). When ``gate`` and ``up``
are the two halves of one projection output (hybridflow.models.fused_projections), :class:`PackedSwiGLU` takes that
output as its input and writes both gradients into one buffer: no ``cat`` of the halves' gradients.

Installed per module by :func:`fuse_norms_and_swiglu` (from ``autocast_forward``, on a CPU) only where the module's
forward reproduces on a probe (RMSNorm: the same output bits, gradients within fp32 rounding; MLP: the same bits);
outside CPU autocast each module's own forward runs, so fp32 training is unchanged.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F


class RMSNorm(torch.autograd.Function):
    """HF's ``LlamaRMSNorm`` forward (same bits, same output dtype) with the closed-form backward above. The math
    runs in fp32 as HF's does (fp64 in fp64, for gradcheck; HF would round an fp64 input to fp32)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, r, weight)
        if x.dtype == xf.dtype == weight.dtype:
            return torch.mul(xf, r).mul_(weight)  # w * h == h * w bit for bit; one buffer
        return weight * (xf * r).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, r, weight = ctx.saved_tensors
        width = x.shape[-1]
        x2, r2, g2 = x.reshape(-1, width), r.reshape(-1, 1), grad.reshape(-1, width)
        with torch.autocast(x.device.type, enabled=False):  # fp32 matrix-vector products, whatever the caller's state
            if x.dtype == r.dtype == weight.dtype == grad.dtype:
                dx, dw = _same_dtype_backward(x2, r2, g2, weight, width)
            else:
                dx, dw = _general_backward(x2, r2, g2, weight, width)
        return dx.view(x.shape), dw, None


def _same_dtype_backward(x, r, g, weight, width):
    """fp32 rows and weight (the residual stream under autocast): ``P = g x``; ``<gh, x> = P @ w``,
    ``dw = r^T P``; then ``dx`` into ``P``'s buffer."""
    prod = torch.mul(g, x)
    dot = torch.mv(prod, weight)                       # <g w, x> per row
    dw = torch.mv(prod.t(), r.view(-1))                # sum_rows g x r
    coef = (r * r * r).view(-1) * dot / width          # r^3 <gh, x> / D, per row
    dx = torch.mul(g, weight, out=prod).mul_(r)        # r g w
    return dx.addcmul_(x, coef.unsqueeze(1), value=-1), dw


def _general_backward(x, r, g, weight, width):
    """Any other dtypes (a bf16 ``x``: Qwen3's q / k norms): fp32 math, ``gh`` and ``h`` rounded to ``x``'s dtype
    where HF's graph rounds them."""
    compute = torch.promote_types(x.dtype, torch.float32)
    xf, gf = x.to(compute), g.to(compute)
    h = (xf * r).to(x.dtype)
    gh = (gf * weight.to(compute)).to(x.dtype).to(compute)
    dot = (gh * xf).sum(-1, keepdim=True)
    dx = (gh * r - xf * (r * r * r * dot / width)).to(x.dtype)
    dw = (gf * h.to(compute)).sum(0).to(weight.dtype)
    return dx, dw


class SwiGLU(torch.autograd.Function):
    """``silu(gate) * up`` with torch's kernels (HF's bits and saved tensors: ``gate``, ``up``, ``silu(gate)``)."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        act = F.silu(gate)
        ctx.save_for_backward(gate, up, act)
        return act * up

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        gate, up, act = ctx.saved_tensors
        with torch.autocast(gate.device.type, enabled=False):
            return swiglu_grads(grad, gate, up, act)


class PackedSwiGLU(torch.autograd.Function):
    """:class:`SwiGLU` of the two halves of ``packed`` (``[..., 2I]``: gate then up); its gradient comes back in
    one ``[..., 2I]`` buffer, so the projection's split needs no ``cat`` in the backward."""

    @staticmethod
    def forward(ctx, packed: torch.Tensor) -> torch.Tensor:
        gate, up = packed.chunk(2, dim=-1)
        act = F.silu(gate)
        ctx.save_for_backward(packed, act)
        return act * up

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        packed, act = ctx.saved_tensors
        gate, up = packed.chunk(2, dim=-1)
        out = torch.empty_like(packed)
        d_gate, d_up = out.chunk(2, dim=-1)
        with torch.autocast(packed.device.type, enabled=False):
            swiglu_grads(grad, gate, up, act, d_gate, d_up)
        return out


def swiglu_grads(grad, gate, up, act, d_gate=None, d_up=None):
    """HF's gradients of ``act * up`` with ``act = silu(gate)``: ``d_up = g act``, ``d_gate = silu'(gate) (g up)``,
    each with torch's kernels and HF's roundings, into ``d_gate`` / ``d_up`` when given (the halves of one buffer)."""
    grad_act = (grad * up).to(act.dtype)  # HF's gradient of act, in act's dtype
    if d_up is None:
        return torch.ops.aten.silu_backward(grad_act, gate), grad * act
    torch.mul(grad, act, out=d_up)
    torch.ops.aten.silu_backward.grad_input(grad_act, gate, grad_input=d_gate)
    return d_gate, d_up


def packed_halves(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor | None:
    """The ``[..., 2I]`` tensor whose halves are exactly ``gate`` and ``up`` (views of one projection output), or
    None when they are not."""
    base = gate._base
    if base is None or up._base is not base or base.shape[-1] != 2 * gate.shape[-1] or not base.is_contiguous():
        return None
    gate_view, up_view = base.chunk(2, dim=-1)
    same = all(a.shape == b.shape and a.stride() == b.stride() and a.storage_offset() == b.storage_offset()
               for a, b in ((gate, gate_view), (up, up_view)))
    return base if same else None


HALF_OR_SINGLE = (torch.float32, torch.bfloat16, torch.float16)
"""Input dtypes the fused RMSNorm takes (HF's computes an fp64 input in fp32; the fused one would in fp64)."""


class FusedRMSNormForward:
    """An RMSNorm module's forward: :class:`RMSNorm` under CPU autocast, else the class's own forward (a picklable,
    deep-copyable callable, not a closure)."""

    def __init__(self, module: torch.nn.Module, eps: float):
        self.module, self.eps = module, eps

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.module.weight
        if (_cpu_autocast(hidden) and hidden.dtype in HALF_OR_SINGLE and hidden.shape[-1] == weight.numel()
                and weight.dim() == 1):
            return RMSNorm.apply(hidden, weight, self.eps)
        return type(self.module).forward(self.module, hidden)


class FusedMLPForward:
    """A SwiGLU MLP's forward: ``down(SwiGLU(gate(x), up(x)))`` under CPU autocast, else the class's own forward."""

    def __init__(self, module: torch.nn.Module):
        self.module = module

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        mlp = self.module
        if not _cpu_autocast(hidden):
            return type(mlp).forward(mlp, hidden)
        gate, up = mlp.gate_proj(hidden), mlp.up_proj(hidden)  # HF's order: fused_projections computes both in gate
        packed = packed_halves(gate, up)
        act = SwiGLU.apply(gate, up) if packed is None else PackedSwiGLU.apply(packed)
        return mlp.down_proj(act)


def _cpu_autocast(hidden: torch.Tensor) -> bool:
    return hidden.device.type == "cpu" and torch.is_autocast_enabled("cpu")


def fuse_norms_and_swiglu(model: torch.nn.Module, *, dtype: torch.dtype = torch.bfloat16) -> int:
    """Give each RMSNorm and SwiGLU MLP of ``model`` (on a CPU) the fused forward where it reproduces the module's
    own on a probe under ``dtype`` autocast (:func:`norm_reproduces`, :func:`mlp_reproduces`); the number of
    modules changed now. Idempotent; the replacement is the module's own forward outside CPU autocast."""
    changed = 0
    for module in model.modules():
        if isinstance(module.__dict__.get("forward"), (FusedRMSNormForward, FusedMLPForward)):
            continue
        fused = _candidate(module)
        if fused is None:
            continue
        check = norm_reproduces if isinstance(fused, FusedRMSNormForward) else mlp_reproduces
        if check(module, fused, dtype=dtype):
            module.forward = fused
            changed += 1
    return changed


def _candidate(module: torch.nn.Module):
    """The fused forward to try for ``module``: an RMSNorm (a class named ``*RMSNorm`` with a 1-D ``weight``, an
    epsilon and no children), a SwiGLU MLP (``gate_proj`` / ``up_proj`` / ``down_proj`` and ``act_fn``); else None."""
    params = dict(module.named_parameters(recurse=False))
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if (type(module).__name__.endswith("RMSNorm") and set(params) == {"weight"} and params["weight"].dim() == 1
            and isinstance(eps, float) and not list(module.children()) and module.weight.device.type == "cpu"):
        return FusedRMSNormForward(module, eps)
    if all(hasattr(module, name) for name in ("gate_proj", "up_proj", "down_proj", "act_fn")):
        weight = getattr(module.down_proj, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.device.type == "cpu":
            return FusedMLPForward(module)
    return None


def norm_reproduces(module, fused: FusedRMSNormForward, *, dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether ``fused`` gives the module's own outputs (bits and dtype) and input / weight gradients (within fp32
    rounding; the closed form sums in another order) under CPU autocast, for an fp32 and a ``dtype`` input, with a
    random weight (a copy of the module: an HF init of ones would hide ``(1 + w)`` variants)."""
    gen = torch.Generator().manual_seed(0)
    probe = _norm_copy(module, gen)
    for x_dtype in (torch.float32, dtype):
        x = (torch.randn(2, 3, probe.weight.numel(), generator=gen) * 3).to(x_dtype).requires_grad_()
        results = []
        for forward in (type(module).forward, lambda m, h: RMSNorm.apply(h, m.weight, fused.eps)):
            with torch.autocast("cpu", dtype=dtype):
                out = forward(probe, x)
            upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype)
            results.append((out, *torch.autograd.grad(out, (x, probe.weight), upstream, allow_unused=True)))
        (out, *grads), (fused_out, *fused_grads) = results
        if out.dtype != fused_out.dtype or not torch.equal(out, fused_out) or None in grads:
            return False
        tolerance = 1e-5 if x_dtype == torch.float32 else 2**-6
        if not all(torch.allclose(a.double(), b.double(), rtol=tolerance, atol=tolerance * b.abs().max().item())
                   for a, b in zip(grads, fused_grads)):
            return False
    return True


def _norm_copy(module, gen):
    """A copy of an RMSNorm module (parameters detached) with a random weight around 1."""
    probe = copy.copy(module)  # a shallow copy; its own parameter dict below
    probe.__dict__.pop("forward", None)
    probe._parameters = {"weight": torch.nn.Parameter(1 + torch.randn(module.weight.shape, generator=gen) / 4)}
    return probe


def mlp_reproduces(module, fused: FusedMLPForward, *, dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether ``fused`` gives the module's own output and input gradient bit for bit under CPU autocast on a small
    random fp32 input (the norm's output dtype under autocast); the module's weights, no parameter gradient kept."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 3, module.down_proj.weight.shape[0], generator=gen).requires_grad_()
    results = []
    for forward in (lambda h: type(module).forward(module, h), fused):
        with torch.autocast("cpu", dtype=dtype):
            out = forward(x)
        upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype)
        results.append((out, *torch.autograd.grad(out, (x,), upstream)))
    return all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(*results))

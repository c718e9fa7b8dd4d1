"""HF's RMSNorm and SwiGLU product under CPU autocast as autograd functions (hybridflow.models.fused_norms)."""

import copy

import pytest
import torch
import torch.nn.functional as F
from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from hybridflow.models import fused_norms
from hybridflow.models.fsdp import autocast_forward
from hybridflow.models.fused_norms import (FusedMLPForward, FusedRMSNormForward, PackedSwiGLU, RMSNorm, SwiGLU,
                                           fuse_norms_and_swiglu, norm_reproduces, packed_halves)
from hybridflow.models.fused_projections import fuse_sibling_projections
from hybridflow.models.tiny import build_tiny_model

BF16, F32, F64 = torch.bfloat16, torch.float32, torch.float64


def hf_norm(x, weight, eps):
    """HF's LlamaRMSNorm.forward, written out (fp64 in, fp64 math: the reference)."""
    h = x.to(torch.promote_types(x.dtype, F32))
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def test_norm_and_its_gradients_by_hand():
    """x = (2, 2), eps 0: r = 1/2, h = (1, 1), w = (1, 3): y = (1, 3). g = (1, 1): gh = (1, 3), <gh, x> = 8,
    dx = r gh - x r^3 8 / 2 = (0.5, 1.5) - (1, 1) = (-0.5, 0.5), dw = g h = (1, 1) (all exact in fp32)."""
    x = torch.tensor([[2.0, 2.0]], requires_grad=True)
    w = torch.tensor([1.0, 3.0], requires_grad=True)
    y = RMSNorm.apply(x, w, 0.0)
    assert y.tolist() == [[1.0, 3.0]]
    y.backward(torch.ones(1, 2))
    assert x.grad.tolist() == [[-0.5, 0.5]] and w.grad.tolist() == [1.0, 1.0]


@pytest.mark.parametrize("shape", [(3, 5, 37), (7, 1, 13), (1, 2, 576)])
@pytest.mark.parametrize("x_dtype", [F32, BF16])
def test_norm_matches_an_fp64_reference_and_hfs_forward_bits(shape, x_dtype):
    """Forward: HF's bits and dtype (fp32 weight: an fp32 output, as HF's ``w * h`` promotes); gradients of x and w
    against fp64 autograd of HF's formula on the same (rounded) inputs, within the compute dtype's rounding."""
    gen = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=gen) * 4).to(x_dtype)
    w = 1 + torch.randn(shape[-1], generator=gen) / 4
    g = torch.randn(shape, generator=gen)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    hf_norm(x64, w64, 1e-5).backward(g.double())
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = RMSNorm.apply(xs, ws, 1e-5)
    out.backward(g)
    assert out.dtype == F32 and torch.equal(out, hf_norm(x, w, 1e-5))
    assert xs.grad.dtype == x_dtype and ws.grad.dtype == F32
    # |dx| <~ r |g| |w|: fp32 sums of `shape[-1]` terms; a bf16 dx is rounded once more (and gh before it, as HF)
    bound = 2e-6 if x_dtype == F32 else 2 * 2**-8
    assert ((xs.grad.double() - x64.grad).abs() / x64.grad.abs().max()).max() <= bound
    # dw sums g h over the rows; a bf16 x's h is rounded to bf16 first (HF's w * h.to(x.dtype)): 2^-9 per term
    h64 = (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5)).detach()
    terms = (g.double() * h64).abs().reshape(-1, shape[-1]).sum(0)
    assert ((ws.grad.double() - w64.grad).abs() <= (2e-6 if x_dtype == F32 else 2**-8) * terms).all()


def test_norm_gradcheck_in_fp64():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 11, generator=gen, dtype=F64, requires_grad=True)
    w = torch.randn(11, generator=gen, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: RMSNorm.apply(a, b, 1e-3), (x, w))


def test_the_mixed_dtype_backward_in_fp64_against_autograd():
    """_general_backward (the path of a bf16 x) with every rounding a no-op, fp64: autograd's gradients of HF's
    formula."""
    gen = torch.Generator().manual_seed(4)
    x, w, g = (torch.randn(*s, generator=gen, dtype=F64) for s in ((6, 9), (9,), (6, 9)))
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    hf_norm(xs, ws, 1e-2).backward(g)
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-2)
    dx, dw = fused_norms._general_backward(x, r, g, w, 9)
    torch.testing.assert_close(dx, xs.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dw, ws.grad, rtol=1e-12, atol=1e-12)


def split_halves(width, tokens=7, dtype=BF16, seed=5):
    gen = torch.Generator().manual_seed(seed)
    packed = torch.randn(1, tokens, 2 * width, generator=gen).to(dtype).requires_grad_()
    return packed, torch.randn(1, tokens, width, generator=gen).to(dtype)


@pytest.mark.parametrize("dtype", [BF16, F32])
@pytest.mark.parametrize("width", [1, 13, 1536])
def test_swiglu_is_hfs_silu_times_up_bit_for_bit(dtype, width):
    """Both forms (two tensors; the halves of one projection output) against HF's ``act_fn(gate) * up`` on the
    projection's split halves: output and the packed input's gradient equal bit for bit."""
    packed, upstream = split_halves(width, dtype=dtype)
    results = []
    for form in ("hf", "two", "packed"):
        leaf = packed.detach().clone().requires_grad_()
        gate, up = leaf.split([width, width], -1)
        out = {"hf": lambda: F.silu(gate) * up, "two": lambda: SwiGLU.apply(gate, up),
               "packed": lambda: PackedSwiGLU.apply(packed_halves(gate, up))}[form]()
        out.backward(upstream)
        results.append((out, leaf.grad))
    for out, grad in results[1:]:
        assert out.dtype == dtype and torch.equal(out, results[0][0]) and torch.equal(grad, results[0][1])


def test_swiglu_matches_an_fp64_reference():
    packed, upstream = split_halves(37, tokens=5, seed=6)
    gate64, up64 = (t.detach().double().requires_grad_() for t in packed.split([37, 37], -1))
    (F.silu(gate64) * up64).backward(upstream.double())
    out = PackedSwiGLU.apply(packed)
    out.backward(upstream)
    reference = (F.silu(gate64) * up64).detach()
    # two bf16 roundings forward (silu, the product); the gradients: two rounded products / silu'
    assert ((out.double() - reference).abs() <= 2 * 2**-8 * reference.abs() + 1e-30).all()
    for grad, ref in zip(packed.grad.split([37, 37], -1), (gate64.grad, up64.grad)):
        assert ((grad.double() - ref).abs() <= 3 * 2**-8 * ref.abs().max()).all()


def test_swiglu_gradcheck_in_fp64():
    gen = torch.Generator().manual_seed(7)
    gate, up = (torch.randn(3, 5, generator=gen, dtype=F64, requires_grad=True) for _ in range(2))
    packed = torch.randn(2, 3, 10, generator=gen, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(SwiGLU.apply, (gate, up))
    assert torch.autograd.gradcheck(PackedSwiGLU.apply, (packed,))


def test_packed_halves_only_for_the_two_halves_of_one_tensor_in_order():
    base = torch.randn(2, 3, 8)
    gate, up = base.split([4, 4], -1)
    assert packed_halves(gate, up) is base
    assert packed_halves(up, gate) is None                    # swapped
    assert packed_halves(*base.split([3, 5], -1)) is None     # unequal
    assert packed_halves(gate, torch.randn(2, 3, 4)) is None  # another tensor
    wide = torch.randn(2, 3, 12)
    assert packed_halves(*wide.split([4, 4, 4], -1)[:2]) is None  # not the whole row


class ClampedRMSNorm(LlamaRMSNorm):
    """A norm with its weight clamped at 1: HF's values and gradients while the weight is its init of ones."""

    def forward(self, hidden_states):
        h = hidden_states.float()
        h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)).to(hidden_states.dtype)
        return self.weight.clamp(max=1) * h


def test_a_norm_that_differs_is_not_replaced():
    """Gemma's ``x r (1 + w)`` (HF's class name, epsilon and weight) and a norm with a clamped weight fail the probe
    (it draws a random weight: the init of ones would hide the second); Llama's passes."""
    llama, gemma, clamped = LlamaRMSNorm(16, eps=1e-6), Gemma2RMSNorm(16, eps=1e-6), ClampedRMSNorm(16, 1e-6)
    assert norm_reproduces(llama, FusedRMSNormForward(llama, 1e-6))
    assert not norm_reproduces(gemma, FusedRMSNormForward(gemma, 1e-6))
    assert not norm_reproduces(clamped, FusedRMSNormForward(clamped, 1e-6))
    wrong_eps = LlamaRMSNorm(16, eps=1e-2)
    assert not norm_reproduces(wrong_eps, FusedRMSNormForward(wrong_eps, 1e-6))


def tiny_under_autocast(architecture):
    plain, _ = build_tiny_model(architecture, seed=0)
    fuse_sibling_projections(plain)
    return plain, copy.deepcopy(plain)


def forward_backward(model, ids, autocast: bool):
    with torch.autocast("cpu", dtype=BF16, enabled=autocast):
        logits = model(input_ids=ids).logits.float()
    torch.log_softmax(logits, -1)[..., 0].sum().backward()
    return logits, {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("architecture,count", [("llama", 7), ("qwen3", 11), ("gemma2", 0)])
def test_a_model_under_autocast_gives_hfs_logits_and_close_gradients(architecture, count):
    """Tiny models (2 layers): Llama's 5 norms and 2 MLPs fused, Qwen3's q / k norms too (bf16 inputs), Gemma 2's
    none ((1 + w) norms, a GELU MLP); the same logits bit for bit, gradients within fp32 summation-order rounding."""
    plain, fused = tiny_under_autocast(architecture)
    assert fuse_norms_and_swiglu(fused) == count and fuse_norms_and_swiglu(fused) == 0  # idempotent
    ids = torch.randint(0, plain.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    plain_logits, plain_grads = forward_backward(plain, ids, autocast=True)
    fused_logits, fused_grads = forward_backward(fused, ids, autocast=True)
    assert torch.equal(plain_logits, fused_logits)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(fused_grads[name], grad, rtol=1e-5, atol=1e-5 * grad.abs().max().item())


def test_outside_autocast_a_fused_model_is_hfs_bit_for_bit():
    plain, fused = tiny_under_autocast("llama")
    assert fuse_norms_and_swiglu(fused) == 7
    ids = torch.randint(0, plain.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    (plain_logits, plain_grads), (fused_logits, fused_grads) = (forward_backward(m, ids, autocast=False)
                                                                for m in (plain, fused))
    assert torch.equal(plain_logits, fused_logits)
    assert all(torch.equal(plain_grads[name], fused_grads[name]) for name in plain_grads)


@pytest.mark.filterwarnings("ignore:CUDA is not available")
def test_autocast_forward_installs_them_on_a_cpu_only():
    cpu, _ = build_tiny_model("llama", seed=0)
    elsewhere = copy.deepcopy(cpu)
    autocast_forward(cpu, device_type="cpu", dtype=BF16)
    autocast_forward(elsewhere, device_type="cuda", dtype=BF16)  # installs nothing of fused_norms (no GPU needed)
    assert isinstance(cpu.model.norm.__dict__.get("forward"), FusedRMSNormForward)
    assert isinstance(cpu.model.layers[0].mlp.__dict__.get("forward"), FusedMLPForward)
    assert not any(isinstance(m.__dict__.get("forward"), (FusedRMSNormForward, FusedMLPForward))
                   for m in elsewhere.modules())

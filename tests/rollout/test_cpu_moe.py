"""The routed experts' C kernel (issue 58): equal to the torch path in fp64 to fp32 rounding for SiLU-halves and
gpt-oss's clamped SwiGLU experts, ragged sizes (hidden and intermediate not multiples of 16, token counts not of
4), one value by hand, and the fallbacks (not fp32, kernels off, a non-SiLU activation)."""

import functools
import math

import pytest
import torch
import torch.nn.functional as F

from hybridflow.rollout import cpu_kernels
from hybridflow.rollout.cpu_moe import routed_experts
from hybridflow.rollout.moe import ExpertWeights, clamped_swiglu, grouped_experts

pytestmark = pytest.mark.skipif(cpu_kernels.library() is None, reason="no C compiler: the kernels are not built")


def layer(*, experts=5, hidden=40, inner=24, clamp=None, biases=False, dtype=torch.float32, seed=0):
    """Random experts; ``clamp`` ``(alpha, limit)`` makes them gpt-oss's (interleaved gate / up, clamped SwiGLU)."""
    generator = torch.Generator().manual_seed(seed)

    def draw(*size):
        return torch.randn(*size, generator=generator).to(dtype)

    gated = None if clamp is None else functools.partial(clamped_swiglu, alpha=clamp[0], limit=clamp[1])
    return ExpertWeights(router=draw(experts, hidden), gate_up=draw(experts, 2 * inner, hidden),
                         down=draw(experts, hidden, inner) / inner**0.5, top_k=2, renormalize=False,
                         weights_in_activation_dtype=True, gate_up_bias=draw(experts, 2 * inner) if biases else None,
                         down_bias=draw(experts, hidden) if biases else None, clamp=clamp, gated=gated)


def fp64(experts: ExpertWeights) -> ExpertWeights:
    def cast(t):
        return None if t is None else t.double()

    return ExpertWeights(router=cast(experts.router), gate_up=cast(experts.gate_up), down=cast(experts.down),
                         top_k=experts.top_k, renormalize=False, weights_in_activation_dtype=True,
                         gate_up_bias=cast(experts.gate_up_bias), down_bias=cast(experts.down_bias),
                         clamp=experts.clamp, gated=experts.gated)


def routing(count, experts, top_k=2, seed=1):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(experts, generator=generator)[:top_k] for _ in range(count)])
    return torch.rand(count, top_k, generator=generator), ids


@pytest.mark.parametrize("clamp,biases", [(None, False), (None, True), ((1.702, 0.7), True)],
                         ids=["silu", "silu-biases", "gpt-oss"])
@pytest.mark.parametrize("count", [1, 5, 64])
def test_the_kernel_equals_the_torch_experts(clamp, biases, count):
    """Against :func:`grouped_experts` in fp64: a limit of 0.7 clamps most gates and ups of these N(0, 40) sums."""
    experts = layer(clamp=clamp, biases=biases)
    assert experts.cpu_kernel is not None and experts.cpu_kernel.gate_kind == (0 if clamp is None else 1)
    hidden = torch.randn(count, 40, generator=torch.Generator().manual_seed(2))
    weights, ids = routing(count, 5)
    expected = grouped_experts(hidden.double(), weights.double(), ids, fp64(experts), F.silu)
    got = routed_experts(hidden, weights, ids, experts.cpu_kernel, F.silu)
    assert got.dtype == torch.float32 and got.shape == (count, 40)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


def test_every_token_on_the_same_experts_and_unused_experts():
    experts = layer(experts=6, clamp=(1.702, 7.0), biases=True)
    hidden = torch.randn(9, 40, generator=torch.Generator().manual_seed(3))
    ids = torch.tensor([[4, 1]] * 9)
    weights = torch.rand(9, 2, generator=torch.Generator().manual_seed(4))
    expected = grouped_experts(hidden.double(), weights.double(), ids, fp64(experts), F.silu)
    torch.testing.assert_close(routed_experts(hidden, weights, ids, experts.cpu_kernel, F.silu).double(), expected,
                               rtol=1e-5, atol=1e-5)


def test_one_clamped_swiglu_expert_by_hand():
    """hidden 1, one expert of inner 1, alpha 2, limit 1: gate_up = [2 x + 0.5, 3 x] (interleaved), act =
    (clamp(u, -1, 1) + 1) * g' sigmoid(2 g') with g' = min(g, 1), y = 3 act - 1, out = 0.5 y:
    x = 1: g = 2.5 -> 1, u = 3 -> 1, act = 2 sigmoid(2); x = 0.1: g = 0.7, u = 0.3, act = 1.3 * 0.7 sigmoid(1.4);
    x = -0.25: g = 0, act = 0."""
    experts = ExpertWeights(router=torch.ones(1, 1), gate_up=torch.tensor([[[2.0], [3.0]]]),
                            down=torch.tensor([[[3.0]]]), top_k=1, renormalize=False, weights_in_activation_dtype=True,
                            gate_up_bias=torch.tensor([[0.5, 0.0]]), down_bias=torch.tensor([[-1.0]]),
                            clamp=(2.0, 1.0))
    hidden = torch.tensor([[1.0], [0.1], [-0.25]])
    out = routed_experts(hidden, torch.full((3, 1), 0.5), torch.zeros(3, 1, dtype=torch.long), experts.cpu_kernel,
                         F.silu)

    def sigmoid(z):
        return 1 / (1 + math.exp(-z))

    acts = [2 * sigmoid(2.0), 1.3 * 0.7 * sigmoid(1.4), 0.0]
    torch.testing.assert_close(out, torch.tensor([[0.5 * (3 * a - 1)] for a in acts]), rtol=1e-6, atol=1e-6)


def test_silu_halves_by_hand():
    """gate_up = [x, 2 x] over halves, x = 1: silu(1) * 2 = 2 / (1 + e^-1); down 1, weight 1."""
    experts = ExpertWeights(router=torch.ones(1, 1), gate_up=torch.tensor([[[1.0], [2.0]]]),
                            down=torch.tensor([[[1.0]]]), top_k=1, renormalize=False, weights_in_activation_dtype=True)
    out = routed_experts(torch.ones(1, 1), torch.ones(1, 1), torch.zeros(1, 1, dtype=torch.long), experts.cpu_kernel,
                         F.silu)
    torch.testing.assert_close(out, torch.tensor([[2 / (1 + math.exp(-1.0))]]), rtol=1e-6, atol=1e-6)


def test_where_the_kernel_does_not_run_the_torch_path_does(monkeypatch):
    """bf16 experts, a GELU activation over SiLU-halves experts, fp64 activations, and the kernels forced off: no
    kernel (``None``), and :func:`moe_mlp` answers by the torch path."""
    from hybridflow.rollout.moe import moe_mlp, route

    assert layer(dtype=torch.bfloat16).cpu_kernel is None
    experts = layer()
    hidden = torch.randn(3, 40)
    weights, ids = route(hidden, experts)
    assert routed_experts(hidden, weights, ids, experts.cpu_kernel, F.gelu) is None
    assert routed_experts(hidden.double(), weights, ids, experts.cpu_kernel, F.silu) is None
    torch.testing.assert_close(moe_mlp(hidden, experts, F.gelu), grouped_experts(hidden, weights, ids, experts, F.gelu))
    monkeypatch.setenv(cpu_kernels.FORCE_FALLBACK, "torch")
    cpu_kernels.library.cache_clear()
    try:
        assert layer().cpu_kernel is None
    finally:
        monkeypatch.delenv(cpu_kernels.FORCE_FALLBACK)
        cpu_kernels.library.cache_clear()


def test_an_expert_id_out_of_range_is_refused():
    experts = layer()
    with pytest.raises(ValueError, match="expert id outside"):
        routed_experts(torch.randn(2, 40), torch.ones(2, 2), torch.tensor([[0, 5], [1, 2]]), experts.cpu_kernel,
                       F.silu)


@pytest.mark.parametrize("n_shared", [1, 2])
def test_glm_sparse_mlp_with_its_shared_expert_in_the_same_call_equals_the_torch_path(n_shared):
    """GLM-4.5's sparse MLP: with one shared expert the kernel runs it as expert E (weight 1) in the routed call;
    with two (twice as wide as a routed expert) the shared MLP stays HF's module beside the kernel. Both equal the
    torch path (routed experts grouped in torch plus the module) to fp32 rounding."""
    import copy

    from hybridflow.rollout.grouped_moe import grouped_moe_mlp, grouped_moe_weights
    from tests.rollout.test_glm4_moe import glm

    model, _ = glm(seed=2, n_shared_experts=n_shared)
    moe = grouped_moe_weights(model.model.layers[1].mlp)
    assert (moe.with_shared is not None) == (n_shared == 1)
    torch_path = copy.copy(moe)
    torch_path.with_shared, torch_path.experts = None, copy.copy(moe.experts)
    torch_path.experts.cpu_kernel = None
    hidden = torch.randn(7, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = grouped_moe_mlp(hidden.double(), double_moe(torch_path), F.silu)
        torch.testing.assert_close(grouped_moe_mlp(hidden, moe, F.silu).double(), expected, rtol=1e-5, atol=1e-5)


def double_moe(moe):
    """The sparse MLP in fp64 (the torch path's reference)."""
    import copy

    copied = copy.copy(moe)
    copied.router, copied.correction_bias = moe.router.double(), moe.correction_bias.double()
    copied.experts = fp64(moe.experts)
    copied.shared = copy.deepcopy(moe.shared).double()
    return copied

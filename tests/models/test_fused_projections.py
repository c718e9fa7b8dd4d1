"""q / k / v and gate / up as one matmul under autocast (hybridflow.models.fused_projections)."""

import copy

import pytest
import torch

from hybridflow.models.fsdp import autocast_forward
from hybridflow.models.fused_projections import FusedSiblings, fuse_sibling_projections
from hybridflow.models.tiny import build_tiny_model


def _linear(rows: list[list[float]], bias: list[float] | None = None) -> torch.nn.Linear:
    linear = torch.nn.Linear(len(rows[0]), len(rows), bias=bias is not None)
    with torch.no_grad():
        linear.weight.copy_(torch.tensor(rows))
        if bias is not None:
            linear.bias.copy_(torch.tensor(bias))
    return linear


def test_one_matmul_gives_each_projection_its_block_and_gradient_by_hand():
    """x = (1, 2); q = I x, k = (2 1) x + 1, v = [[1 1] [1 -1] [0 3]] x: q = (1, 2), k = (5), v = (3, -1, 6); for
    loss = sum q + 2 sum k + 3 sum v, dx = (1, 1) + 2 (2, 1) + 3 (2, 3) = (11, 12) and dW_v = 3 x per row (exact in
    bf16)."""
    linears = [_linear([[1, 0], [0, 1]], [0, 0]), _linear([[2, 1]], [1]), _linear([[1, 1], [1, -1], [0, 3]], [0, 0, 0])]
    group = FusedSiblings(linears)
    hidden = torch.tensor([[1.0, 2.0]], requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q, k, v = group.first(hidden), group.take(1, hidden), group.take(2, hidden)
    assert q.dtype == torch.bfloat16 and group.pending is None
    assert (q.tolist(), k.tolist(), v.tolist()) == ([[1, 2]], [[5]], [[3, -1, 6]])
    (q.float().sum() + 2 * k.float().sum() + 3 * v.float().sum()).backward()
    assert hidden.grad.tolist() == [[11, 12]]
    assert linears[2].weight.grad.tolist() == [[3, 6]] * 3 and linears[1].bias.grad.tolist() == [2]


def test_outside_autocast_or_on_another_input_each_projection_is_its_own_linear():
    linears = [_linear([[1, 0]]), _linear([[0, 1]])]
    group = FusedSiblings(linears)
    x, y = torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 4.0]])
    assert group.first(x).tolist() == [[1]] and group.take(1, x).tolist() == [[2]]  # fp32, no autocast
    with torch.autocast("cpu", dtype=torch.bfloat16):
        group.first(x)
        assert group.take(1, y).tolist() == [[4]]  # not the block computed for x


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])  # qwen2: q / k / v with biases
def test_fused_model_matches_the_plain_one_within_bf16_rounding(architecture):
    plain, _ = build_tiny_model(architecture, seed=0)
    fused = autocast_forward(copy.deepcopy(plain), device_type="cpu", dtype=torch.bfloat16)
    layers = len(plain.model.layers)
    assert fuse_sibling_projections(fused) == 0  # already fused: idempotent
    assert all("forward" in vars(layer.self_attn.k_proj) for layer in fused.model.layers)
    assert fuse_sibling_projections(copy.deepcopy(plain)) == 2 * layers
    ids = torch.randint(0, plain.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    results = []
    for model, context in ((plain, torch.autocast("cpu", dtype=torch.bfloat16)), (fused, torch.enable_grad())):
        with context:
            logits = model(input_ids=ids).logits.float()
        torch.log_softmax(logits, -1)[..., 0].sum().backward()
        results.append((logits, {name: p.grad for name, p in model.named_parameters()}))
    (plain_logits, plain_grads), (fused_logits, fused_grads) = results
    torch.testing.assert_close(fused_logits, plain_logits, atol=2e-2, rtol=2e-2)
    for name, grad in plain_grads.items():  # bf16 matmuls: within a few bf16 ulps of the gradient's scale
        assert (fused_grads[name] - grad).abs().max() <= 3e-2 * grad.abs().max() + 1e-6, name
    copied = copy.deepcopy(fused)  # a deep copy's fused forwards use the copy's own weights
    layer = copied.model.layers[0]
    assert layer.mlp.up_proj.forward.group.linears[1] is layer.mlp.up_proj

"""PackedLinear: the oneDNN-packed projection equals ``x W^T + b`` at every row count."""

import pytest
import torch

from hybridflow.rollout.packed_linear import PackedLinear, onednn_packing_available


def reference_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``y[n, o] = sum_i x[n, i] W[o, i] + b[o]``, summed in float64."""
    y = (x.double()[:, None, :] * weight.double()[None, :, :]).sum(-1)
    return (y if bias is None else y + bias.double()).to(x.dtype)


@pytest.mark.parametrize("rows", [1, 3, 64, 65, 130])  # below, at and above the packing hint
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_linear_equals_reference_at_every_row_count(rows, with_bias):
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(48, 40, generator=generator)
    bias = torch.randn(48, generator=generator) if with_bias else None
    x = torch.randn(rows, 40, generator=generator)
    out = PackedLinear(weight, bias)(x)
    assert out.shape == (rows, 48)
    torch.testing.assert_close(out, reference_linear(x, weight, bias), rtol=1e-5, atol=1e-5)


def test_cpu_fp32_weights_are_packed_and_others_fall_back():
    assert PackedLinear(torch.randn(4, 4)).packed == onednn_packing_available(torch.randn(4, 4))
    assert not PackedLinear(torch.randn(4, 4, dtype=torch.float64)).packed
    weight = torch.randn(6, 5, dtype=torch.float64)
    x = torch.randn(2, 5, dtype=torch.float64)
    torch.testing.assert_close(PackedLinear(weight)(x), reference_linear(x, weight, None))


def test_packed_copy_is_a_snapshot_until_rebuilt():
    """The engine rebuilds its PackedLinears in ``load_weights``; a stale one keeps the old weight."""
    weight, x = torch.ones(3, 2), torch.ones(1, 2)
    before = PackedLinear(weight)
    weight.mul_(2)
    if before.packed:
        torch.testing.assert_close(before(x), torch.full((1, 3), 2.0))
    torch.testing.assert_close(PackedLinear(weight)(x), torch.full((1, 3), 4.0))


@pytest.mark.skipif(not onednn_packing_available(torch.ones(1, dtype=torch.bfloat16)), reason="needs oneDNN")
def test_bf16_packed_linear_is_close_to_reference():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(16, 32, generator=generator).bfloat16()
    x = torch.randn(5, 32, generator=generator).bfloat16()
    out = PackedLinear(weight)(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), reference_linear(x.float(), weight.float(), None), rtol=2e-2, atol=5e-2)

"""PackedLinear: the oneDNN-packed projection (where this CPU has it) and the portable fallback
both equal ``x W^T + b`` at every row count; the fallback is forced so both run on any machine."""

import pytest
import torch

from hybridflow.rollout import bf16_linear, packed_linear
from hybridflow.rollout.packed_linear import PackedLinear, kernel_path as path_for, onednn_packing_available


def reference_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``y[n, o] = sum_i x[n, i] W[o, i] + b[o]``, summed in float64."""
    y = (x.double()[:, None, :] * weight.double()[None, :, :]).sum(-1)
    return (y if bias is None else y + bias.double()).to(x.dtype)


@pytest.mark.parametrize("rows", [1, 3, 64, 65, 130])  # below, at and above the packing hint
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_linear_equals_reference_at_every_row_count(rows, with_bias, kernel_path):
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


def test_forcing_the_portable_path_disables_packing_for_every_dtype(monkeypatch):
    monkeypatch.setenv(packed_linear.PORTABLE_KERNELS_ENV, "1")
    for dtype in (torch.float32, torch.bfloat16):
        layer = PackedLinear(torch.randn(4, 4).to(dtype))
        assert not layer.packed and layer.path == "F.linear (HYBRIDFLOW_PORTABLE_KERNELS=1)"


def test_a_cpu_without_the_isa_falls_back_with_the_reason(monkeypatch):
    """What an AVX2-only CPU does with bf16: oneDNN raises while packing, the probe catches it once (and the bf16
    kernel, which needs AVX-512-BF16, is not built there)."""
    def no_bf16_isa(weight, hint):
        raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert "
                           "or avx512bw, avx512vl and avx512dq\nmore detail")

    monkeypatch.delenv(packed_linear.PORTABLE_KERNELS_ENV, raising=False)
    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", no_bf16_isa)
    monkeypatch.setattr(bf16_linear, "unavailable_reason", lambda: "no AVX-512-BF16 in this CPU's kernel build")
    packed_linear._onednn_packing_probe.cache_clear()
    try:
        layer = PackedLinear(torch.randn(16, 32).bfloat16())
        assert not layer.packed
        assert layer.path.startswith("F.linear (portable fallback: mkldnn_reorder_linear_weight: bf16 path")
        assert "more detail" not in layer.path
        x = torch.randn(3, 32).bfloat16()
        torch.testing.assert_close(layer(x).float(), reference_linear(x.float(), layer.weight.float(), None),
                                   rtol=2e-2, atol=5e-2)
    finally:
        packed_linear._onednn_packing_probe.cache_clear()


def test_the_path_names_the_device_and_dtype():
    assert path_for(torch.float64) == "F.linear (oneDNN packing does not cover torch.float64)"
    assert path_for(torch.float32, "meta") == "F.linear (meta)"


def test_packed_copy_is_a_snapshot_until_rebuilt(kernel_path):
    """The engine rebuilds its PackedLinears in ``load_weights``; a stale one keeps the old weight."""
    weight, x = torch.ones(3, 2), torch.ones(1, 2)
    before = PackedLinear(weight)
    weight.mul_(2)
    if before.packed:
        torch.testing.assert_close(before(x), torch.full((1, 3), 2.0))
    torch.testing.assert_close(PackedLinear(weight)(x), torch.full((1, 3), 4.0))


def test_bf16_linear_is_close_to_reference_on_this_cpus_path(kernel_path):
    """bf16 takes oneDNN packing where the CPU has AVX-512-BF16/AVX-NE-CONVERT, F.linear elsewhere."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(16, 32, generator=generator).bfloat16()
    x = torch.randn(5, 32, generator=generator).bfloat16()
    out = PackedLinear(weight)(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), reference_linear(x.float(), weight.float(), None), rtol=2e-2, atol=5e-2)

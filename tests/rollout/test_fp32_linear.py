"""The fp32 decode matmul kernel (issue 56, csrc/fp32_linear.c): exact on integer sums, within fp32 summation error
of a float64 reference otherwise, at every row count it serves, odd K / N tails, with and without bias; PackedLinear
routes fp32 decode rows to it and falls back to oneDNN / F.linear where it cannot run (no library, an AVX2 build,
HYBRIDFLOW_PORTABLE_KERNELS=1)."""

import ctypes
import shutil
import subprocess

import pytest
import torch

from hybridflow.rollout import bf16_linear, cpu_kernels, fp32_linear, packed_linear
from hybridflow.rollout.packed_linear import FP32_KERNEL_PATH, PackedLinear, kernel_path

needs_kernel = pytest.mark.skipif(fp32_linear.missing_build_reason() is not None,
                                  reason=f"fp32 kernel not built here: {fp32_linear.missing_build_reason()}")
MAX_ROWS = bf16_linear.CHUNK_ROWS  # rows per kernel call


def integers(shape, generator, low=-8, high=9) -> torch.Tensor:
    """Small integers in fp32: every product and every sum below 2^24 is exact in fp32 and float64."""
    return torch.randint(low, high, shape, generator=generator).float()


@needs_kernel
@pytest.mark.parametrize("n, k", [(100, 67), (48, 2), (7, 1), (97, 130)])  # N and K tails, a single k
def test_integer_sums_are_exact_at_every_row_count(n, k):
    generator = torch.Generator().manual_seed(n * 1000 + k)
    weight = integers((n, k), generator)
    packed = fp32_linear.pack(weight)
    assert packed.panels.shape == (-(-n // 48), k, 48, 1)
    bias = torch.arange(n, dtype=torch.float32) - n / 2
    x = integers((2 * MAX_ROWS + 1, k), generator)
    for rows in [*range(1, MAX_ROWS + 1), MAX_ROWS + 1, 2 * MAX_ROWS, 2 * MAX_ROWS + 1]:  # prefill: chunks
        expected = x[:rows].double() @ weight.double().T + bias.double()
        assert torch.equal(fp32_linear.linear(x[:rows], packed, bias).double(), expected), rows
    assert torch.equal(fp32_linear.linear(x[:5], packed).double(), x[:5].double() @ weight.double().T)


@needs_kernel
@pytest.mark.parametrize("rows", [1, 7, 8, 9, 16, 33, 64, MAX_ROWS])
@pytest.mark.parametrize("with_bias", [False, True])
def test_random_inputs_within_fp32_summation_error(rows, with_bias):
    """|y - y64| <= (K + 1) 2^-24 (sum_k |x_k w_k| + |b|): K fused multiply-adds, each rounded once, then the bias."""
    generator = torch.Generator().manual_seed(rows)
    n, k = 101, 577
    weight, x = torch.randn(n, k, generator=generator), torch.randn(rows, k, generator=generator)
    bias = torch.randn(n, generator=generator) if with_bias else None
    y = fp32_linear.linear(x, fp32_linear.pack(weight), bias)
    reference = x.double() @ weight.double().T + (0 if bias is None else bias.double())
    bound = (k + 1) * 2.0**-24 * (x.double().abs() @ weight.double().abs().T
                                  + (0 if bias is None else bias.double().abs()))
    assert y.dtype == torch.float32 and ((y.double() - reference).abs() <= bound).all()


@needs_kernel
def test_the_probe_passes_where_the_kernel_is_built():
    """A wrong kernel must fail here rather than quietly turn itself off (the probe's small exact multiply)."""
    assert fp32_linear.unavailable_reason() is None


@needs_kernel
def test_threads_split_columns_only_so_results_do_not_depend_on_them():
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(4099, 576, generator=generator)  # 86 panels, the last one partial
    x = torch.randn(16, 576, generator=generator)
    packed = fp32_linear.pack(weight)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = fp32_linear.linear(x, packed)
        torch.set_num_threads(2)
        two = fp32_linear.linear(x, packed)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    torch.testing.assert_close(one, (x.double() @ weight.double().T).float(), rtol=1e-5, atol=1e-4)


@needs_kernel
def test_bad_inputs_say_what_to_fix():
    packed = fp32_linear.pack(torch.ones(4, 6))
    with pytest.raises(ValueError, match=r"fp32_linear takes fp32 inputs \[\.\.\., 6\]"):
        fp32_linear.linear(torch.ones(2, 6).bfloat16(), packed)
    with pytest.raises(ValueError, match=r"fp32_linear takes fp32 inputs \[\.\.\., 6\]"):
        fp32_linear.linear(torch.ones(2, 5), packed)


@needs_kernel
def test_packed_linear_takes_the_kernel_at_every_row_count_and_keeps_no_onednn_copy(monkeypatch):
    monkeypatch.delenv(packed_linear.PORTABLE_KERNELS_ENV, raising=False)
    calls = []
    original = bf16_linear.linear
    monkeypatch.setattr(bf16_linear, "linear", lambda *a, **kw: calls.append(a[0].shape[0]) or original(*a, **kw))
    generator = torch.Generator().manual_seed(2)
    weight, bias = torch.randn(96, 64, generator=generator), torch.randn(96, generator=generator)
    layer = PackedLinear(weight, bias)
    assert layer.path == FP32_KERNEL_PATH == kernel_path(torch.float32) and layer.packed
    assert layer.weight is None and not layer.onednn  # issue 62: the kernel's copy only, prefill too
    calls.clear()  # (the kernel's probe, where its cache was cleared)
    for rows in (1, MAX_ROWS - 1, MAX_ROWS, MAX_ROWS + 1, 2 * MAX_ROWS + 1):  # chunk boundaries
        x = torch.randn(rows, 64, generator=generator)
        expected = (x.double() @ weight.double().T + bias.double()).float()
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)
    assert calls == [1, MAX_ROWS - 1, MAX_ROWS, MAX_ROWS + 1, 2 * MAX_ROWS + 1]
    panels = layer.kernel_weight.panels.data_ptr()
    new_weight, new_bias = weight * 2, bias * 3  # (the bias is copied into the layer's, which is ``bias``)
    assert layer.assign(new_weight, new_bias)  # issue 62: a weight sync repacks over the same panels
    assert layer.kernel_weight.panels.data_ptr() == panels
    x = torch.randn(5, 64, generator=generator)
    expected = (x.double() @ new_weight.double().T + new_bias.double()).float()
    torch.testing.assert_close(layer(x).float(), expected, rtol=1e-5, atol=1e-5)
    assert not layer.assign(weight[:48], bias[:48]) and not layer.assign(weight.double(), bias)  # shape, dtype
    assert layer.assign(weight, layer.bias)  # back to the first weight
    layer.bias = bias * 0  # a bias-only change keeps the packed weight: the kernel follows
    x = torch.randn(3, 64, generator=generator)
    torch.testing.assert_close(layer(x), (x.double() @ weight.double().T).float(), rtol=1e-5, atol=1e-5)
    assert PackedLinear(torch.randn(4, 4).bfloat16()).path != FP32_KERNEL_PATH


def test_without_the_library_fp32_falls_back_to_onednn_or_f_linear(monkeypatch):
    assert_falls_back(monkeypatch, None, "the CPU decode kernels are not built")


def assert_falls_back(monkeypatch, library, reason: str) -> None:
    """With ``library`` as the kernels' build: the probe says ``reason`` and PackedLinear keeps oneDNN / F.linear."""
    monkeypatch.delenv(packed_linear.PORTABLE_KERNELS_ENV, raising=False)
    monkeypatch.setattr(cpu_kernels, "library", lambda: library)
    fp32_linear.unavailable_reason.cache_clear()
    try:
        assert fp32_linear.unavailable_reason() == reason
        layer = PackedLinear(torch.ones(8, 4))
        assert layer.path != FP32_KERNEL_PATH and layer.kernel_weight is None
        torch.testing.assert_close(layer(torch.ones(3, 4)), torch.full((3, 8), 4.0))
    finally:
        fp32_linear.unavailable_reason.cache_clear()


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build the AVX2 variant")
def test_an_avx2_build_refuses_and_packed_linear_keeps_onednn(tmp_path, monkeypatch):
    """What an AVX2-only machine builds (-march=haswell): the functions exist, say unsupported and refuse a call,
    and PackedLinear keeps oneDNN / F.linear."""
    built = tmp_path / "fp32_avx2.so"
    subprocess.run(["gcc", "-march=haswell", *cpu_kernels.FLAGS, "-o", str(built),
                    str(cpu_kernels.CSRC / "fp32_linear.c")], check=True, capture_output=True)
    avx2 = ctypes.CDLL(str(built))
    for name in ("fp32_linear_supported", "fp32_linear"):
        getattr(avx2, name).argtypes, getattr(avx2, name).restype = cpu_kernels.SIGNATURES[name], ctypes.c_int
    x, y = torch.ones(2, 4), torch.zeros(2, 8)
    packed = bf16_linear.pack(torch.ones(8, 4), torch.float32)
    assert avx2.fp32_linear_supported() == 0
    assert avx2.fp32_linear(x.data_ptr(), 2, 4, 4, packed.panels.data_ptr(), 8, None, y.data_ptr(), 8, 1, 1) == -1
    assert_falls_back(monkeypatch, avx2, "no AVX-512F in this CPU's kernel build")


def test_forcing_the_portable_path_skips_the_kernel(monkeypatch):
    monkeypatch.setenv(packed_linear.PORTABLE_KERNELS_ENV, "1")
    layer = PackedLinear(torch.ones(8, 4))
    assert layer.path == "F.linear (HYBRIDFLOW_PORTABLE_KERNELS=1)" and layer.kernel_weight is None


@needs_kernel
def test_an_fp32_engine_decodes_the_same_tokens_as_on_onednn(tiny_tokenizer, monkeypatch):
    """The tiny Llama in fp32, greedy and sampled (seeded), on the kernel and on oneDNN's packed matmul (forced by
    turning the kernel off): the sums differ only in order, so the tokens are equal and the log-probs agree to fp32
    summation error."""
    from hybridflow.models.tiny import build_tiny_model
    from tests.rollout.conftest import assert_kernel_decodes_as_onednn

    model, tokenizer = build_tiny_model("llama", seed=1, tokenizer=tiny_tokenizer)
    assert_kernel_decodes_as_onednn(model, tokenizer, fp32_linear, FP32_KERNEL_PATH, monkeypatch, atol=1e-4)

"""The bf16 decode matmul kernel (issue 56, csrc/bf16_linear.c): exact on sums bf16 and fp32 hold exactly, within
fp32 summation error of a float64 reference otherwise, at every row count it serves, odd K / N tails, with and
without bias; PackedLinear routes bf16 decode rows to it and falls back where it cannot run."""

import pytest
import torch

from hybridflow.rollout import bf16_linear, cpu_kernels, packed_linear
from hybridflow.rollout.packed_linear import DPBF16_PATH, PackedLinear, kernel_path

needs_kernel = pytest.mark.skipif(bf16_linear.missing_build_reason() is not None,
                                  reason=f"bf16 kernel not built here: {bf16_linear.missing_build_reason()}")
MAX_ROWS = bf16_linear.CHUNK_ROWS  # rows per kernel call


def integers(shape, generator, low=-8, high=9) -> torch.Tensor:
    """Small integers in bf16: every product and every sum below 2^24 is exact in fp32 and float64."""
    return torch.randint(low, high, shape, generator=generator).bfloat16()


@needs_kernel
@pytest.mark.parametrize("n, k", [(100, 67), (48, 2), (7, 1), (97, 130)])  # N and K tails, a single k
def test_integer_sums_are_exact_at_every_row_count(n, k):
    generator = torch.Generator().manual_seed(n * 1000 + k)
    packed = bf16_linear.pack(integers((n, k), generator))
    weight = packed.panels.permute(0, 2, 1, 3).reshape(-1, packed.panels.shape[1] * 2)[:n, :k]
    bias = torch.arange(n, dtype=torch.float32) - n / 2
    x = integers((2 * MAX_ROWS + 1, k), generator)
    for rows in [*range(1, MAX_ROWS + 1), MAX_ROWS + 1, 2 * MAX_ROWS, 2 * MAX_ROWS + 1]:  # prefill: chunks
        expected = x[:rows].double() @ weight.double().T + bias.double()
        got = bf16_linear.linear(x[:rows], packed, bias, out_dtype=torch.float32)
        assert torch.equal(got.double(), expected), rows
    unbiased = bf16_linear.linear(x[:5], packed, None, out_dtype=torch.float32)
    assert torch.equal(unbiased.double(), x[:5].double() @ weight.double().T)


@needs_kernel
@pytest.mark.parametrize("rows", [1, 7, 8, 9, 16, 33, 64, MAX_ROWS])
@pytest.mark.parametrize("with_bias", [False, True])
def test_random_inputs_within_fp32_summation_error_and_bf16_rounds_once(rows, with_bias):
    """|y - y64| <= (K + 1) 2^-24 sum_k |x_k w_k| + 2^-24 |b| (fp32 sums of exact products); the bf16 output is the
    fp32 output rounded to nearest even, bit for bit."""
    generator = torch.Generator().manual_seed(rows)
    n, k = 101, 577
    weight, x = torch.randn(n, k, generator=generator).bfloat16(), torch.randn(rows, k, generator=generator).bfloat16()
    bias = torch.randn(n, generator=generator) if with_bias else None
    packed = bf16_linear.pack(weight)
    y32 = bf16_linear.linear(x, packed, bias, out_dtype=torch.float32)
    reference = x.double() @ weight.double().T + (0 if bias is None else bias.double())
    bound = (k + 1) * 2.0**-24 * (x.double().abs() @ weight.double().abs().T)
    if bias is not None:
        bound += 2.0**-24 * bias.double().abs()
    assert ((y32.double() - reference).abs() <= bound).all()
    y16 = bf16_linear.linear(x, packed, bias)
    assert y16.dtype == torch.bfloat16 and torch.equal(y16, y32.bfloat16())


@needs_kernel
def test_the_probe_passes_where_the_kernel_is_built():
    """A wrong kernel must fail here rather than quietly turn itself off (the probe's small exact multiply)."""
    assert bf16_linear.unavailable_reason() is None


@needs_kernel
def test_threads_split_columns_only_so_results_do_not_depend_on_them():
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(49152, 576, generator=generator).bfloat16()
    x = torch.randn(16, 576, generator=generator).bfloat16()
    packed = bf16_linear.pack(weight)  # the LM head of SmolLM2-135M
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = bf16_linear.linear(x, packed)
        torch.set_num_threads(2)
        two = bf16_linear.linear(x, packed)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    torch.testing.assert_close(one.float(), x.float() @ weight.float().T, rtol=1e-2, atol=2e-2)


@needs_kernel
def test_bad_inputs_say_what_to_fix():
    packed = bf16_linear.pack(torch.ones(4, 6))
    with pytest.raises(ValueError, match=r"bf16 inputs \[\.\.\., 6\]"):
        bf16_linear.linear(torch.ones(2, 6), packed)
    with pytest.raises(ValueError, match="bf16 or float32"):
        bf16_linear.linear(torch.ones(2, 6).bfloat16(), packed, out_dtype=torch.float16)


@needs_kernel
def test_packed_linear_takes_the_kernel_at_every_row_count_and_keeps_no_onednn_copy(monkeypatch):
    monkeypatch.delenv(packed_linear.PORTABLE_KERNELS_ENV, raising=False)
    calls = []
    original = bf16_linear.linear
    monkeypatch.setattr(bf16_linear, "linear", lambda *a, **kw: calls.append(a[0].shape[0]) or original(*a, **kw))
    generator = torch.Generator().manual_seed(2)
    weight, bias = torch.randn(96, 64, generator=generator).bfloat16(), torch.randn(96, generator=generator).bfloat16()
    layer = PackedLinear(weight, bias)
    assert layer.path == DPBF16_PATH == kernel_path(torch.bfloat16) and layer.packed
    assert layer.weight is None and not layer.onednn  # issue 62: the kernel's copy only, prefill too
    calls.clear()  # (the kernel's probe, where its cache was cleared)
    for rows in (1, MAX_ROWS - 1, MAX_ROWS, MAX_ROWS + 1, 2 * MAX_ROWS + 1):  # chunk boundaries
        x = torch.randn(rows, 64, generator=generator).bfloat16()
        expected = (x.double() @ weight.double().T + bias.double()).float()
        torch.testing.assert_close(layer(x).float(), expected, rtol=1e-2, atol=3e-2)
    assert calls == [1, MAX_ROWS - 1, MAX_ROWS, MAX_ROWS + 1, 2 * MAX_ROWS + 1]
    panels = layer.kernel_weight.panels.data_ptr()
    new_weight, new_bias = weight * 2, bias * 3  # (the bias is copied into the layer's, which is ``bias``)
    assert layer.assign(new_weight, new_bias)  # issue 62: a weight sync repacks over the same panels
    assert layer.kernel_weight.panels.data_ptr() == panels
    x = torch.randn(5, 64, generator=generator).bfloat16()
    expected = (x.double() @ new_weight.double().T + new_bias.double()).float()
    torch.testing.assert_close(layer(x).float(), expected, rtol=1e-2, atol=6e-2)
    assert not layer.assign(weight[:48], bias[:48]) and not layer.assign(weight.double(), bias)  # shape, dtype
    assert layer.assign(weight, layer.bias)  # back to the first weight
    layer.bias = bias * 0  # a bias-only change keeps the packed weight (WeightPacker._linear): the kernel follows
    x = torch.randn(3, 64, generator=generator).bfloat16()
    torch.testing.assert_close(layer(x).float(), (x.double() @ weight.double().T).float(), rtol=1e-2, atol=3e-2)
    assert PackedLinear(torch.randn(4, 4)).path != DPBF16_PATH  # fp32: its own kernel or oneDNN / F.linear


def test_without_the_kernel_bf16_falls_back_to_onednn_or_f_linear(monkeypatch):
    """What a CPU without AVX-512-BF16 (or without a compiler) does: the probe names the reason, PackedLinear
    keeps oneDNN's packing or F.linear, and the result is still x W^T + b."""
    monkeypatch.delenv(packed_linear.PORTABLE_KERNELS_ENV, raising=False)
    monkeypatch.setattr(cpu_kernels, "library", lambda: None)
    bf16_linear.unavailable_reason.cache_clear()
    try:
        assert bf16_linear.unavailable_reason() == "the CPU decode kernels are not built"
        layer = PackedLinear(torch.ones(8, 4).bfloat16())
        assert layer.path != DPBF16_PATH and layer.kernel_weight is None
        torch.testing.assert_close(layer(torch.ones(3, 4).bfloat16()).float(), torch.full((3, 8), 4.0))
    finally:
        bf16_linear.unavailable_reason.cache_clear()


def test_forcing_the_portable_path_skips_the_kernel(monkeypatch):
    monkeypatch.setenv(packed_linear.PORTABLE_KERNELS_ENV, "1")
    layer = PackedLinear(torch.ones(8, 4).bfloat16())
    assert layer.path == "F.linear (HYBRIDFLOW_PORTABLE_KERNELS=1)" and layer.kernel_weight is None


@needs_kernel
def test_a_bf16_engine_decodes_the_same_tokens_as_on_onednn(tiny_tokenizer, monkeypatch):
    """The tiny Llama in bf16, greedy and sampled (seeded), on the kernel and on oneDNN's packed matmul (forced by
    turning the kernel off): both sum bf16 products in fp32 and round once, so the tokens are equal and the log-probs
    agree to bf16 rounding (measured max difference 0.0 here; the kernel rounding by truncation instead: 4e-3)."""
    from hybridflow.models.tiny import build_tiny_model
    from tests.rollout.conftest import assert_kernel_decodes_as_onednn

    model, tokenizer = build_tiny_model("llama", seed=1, tokenizer=tiny_tokenizer)
    model = model.to(torch.bfloat16)
    assert_kernel_decodes_as_onednn(model, tokenizer, bf16_linear, DPBF16_PATH, monkeypatch, atol=1e-3)

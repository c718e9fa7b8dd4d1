"""Building the CPU kernels' library: once per source, flags, compiler and CPU; off, saying why once, where it
cannot be built; and the AVX2 build (what an AVX2-only machine compiles) right on this machine too."""

import shutil

import pytest
import torch

from hybridflow.cpu import cpu_flags
from hybridflow.rollout import cpu_attention, cpu_fused, cpu_kernels
from hybridflow.rollout.decoder import LlamaFamilyDecoder
from tests.rollout import test_cpu_attention, test_cpu_fused, test_cpu_moe
from tests.rollout.test_cpu_attention import reference

pytestmark = pytest.mark.skipif(cpu_kernels.library() is None, reason="no C compiler: the kernels are not built")


@pytest.fixture
def fresh_library():
    """``library()`` looked up again inside the test, and again (the real one) after it."""
    cpu_kernels.library.cache_clear()
    yield
    cpu_kernels.library.cache_clear()


@pytest.mark.parametrize("compiler", ["no-such-compiler", "false"])
def test_without_a_working_compiler_the_kernels_are_off_and_say_why_once(compiler, monkeypatch, tmp_path, caplog,
                                                                        fresh_library, tiny_llama):
    """No compiler on PATH, or one that fails: ``library()`` is None after one warning; decode attention runs SDPA
    over the slot mirror and the layer as torch ops (test_cpu_attention's engine test covers that path)."""
    monkeypatch.setenv("CC", compiler)
    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path))  # no cached build to find
    monkeypatch.setattr(shutil, "which", lambda name: None if name != "false" else "/bin/false")
    with caplog.at_level("WARNING", logger="hybridflow.rollout.cpu_kernels"):
        assert cpu_kernels.library() is None
        assert cpu_kernels.library() is None
    assert len(caplog.records) == 1
    assert "slot mirror" in caplog.records[0].getMessage()
    assert not cpu_attention.supports(dtype=torch.float32, heads=4, kv_heads=2, head_dim=64)
    assert not cpu_fused.available()
    decoder = LlamaFamilyDecoder(tiny_llama[0])
    assert not decoder.paged_cpu_attention and not decoder.fused_cpu_decode


def test_the_fallback_can_be_forced_without_a_warning(monkeypatch, caplog, fresh_library):
    monkeypatch.setenv("HYBRIDFLOW_CPU_KERNELS", "torch")
    with caplog.at_level("WARNING", logger="hybridflow.rollout.cpu_kernels"):
        assert cpu_kernels.library() is None
    assert not caplog.records


@pytest.mark.skipif(not {"avx2", "fma", "bmi2"} <= set(cpu_flags()),
                    reason="this CPU cannot run code built for haswell (AVX2, FMA, BMI2)")
def test_the_library_built_for_avx2_matches_the_torch_ops_too(monkeypatch, tmp_path, fresh_library):
    """What an AVX2-only machine builds (``-march=haswell``: 8-float vectors, no AVX-512), run here: each kernel's
    one source must be right for every instruction set gcc targets."""
    monkeypatch.setenv("HYBRIDFLOW_KERNEL_MARCH", "haswell")
    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path))
    assert cpu_kernels.library() is not None
    assert list(tmp_path.glob("kernels/*.so"))  # built here, not found in the shared cache
    generator = torch.Generator().manual_seed(5)
    keys, values = (torch.randn(2, 30, 4, 64, generator=generator) for _ in range(2))
    tables = (torch.randperm(29, generator=generator)[:21] + 1).view(3, 7).to(torch.int32)
    lengths = torch.tensor([1, 13, 28])
    q = torch.randn(3, 6, 64, generator=generator)
    for window, softcap in ((None, None), (5, 3.0)):
        out = cpu_attention.paged_decode_attention(q=q, keys=keys, values=values, block_tables=tables,
                                                   lengths=lengths, scale=0.125, window=window, softcap=softcap)
        torch.testing.assert_close(out, reference(q, keys, values, tables, lengths, 0.125, window, softcap),
                                   rtol=1e-5, atol=1e-5)
    test_cpu_fused.test_norm_and_silu_match_the_eager_ops()
    test_cpu_fused.test_the_bf16_small_ops_are_the_fp32_ones_on_the_widened_inputs_rounded_once()  # issue 56
    test_cpu_attention.test_the_bf16_kernel_is_the_fp32_math_on_the_widened_pool_rounded_once(9, 3, 64, threads=2)
    test_cpu_attention.test_the_bf16_kernel_against_fp64_over_the_engines_blocks(10, 2, 48)
    assert cpu_kernels.library().paged_decode_attention_bf16_dot_units() == 0
    test_cpu_fused.test_qkv_rope_write_matches_the_eager_ops(qk_norm=True)
    test_cpu_fused.test_sample_rows_draws_what_the_torch_ops_draw(threads=2)
    test_cpu_moe.test_the_kernel_equals_the_torch_experts(clamp=(1.702, 0.7), biases=True, count=5)  # issue 58


@pytest.mark.skipif(not {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"} <= set(cpu_flags()),
                    reason="this CPU cannot run code built for skylake-avx512")
def test_the_bf16_attention_built_for_avx512_without_bf16_units_matches_fp64(monkeypatch, tmp_path, fresh_library):
    """Issue 56: an AVX-512 CPU without AVX-512-BF16 (``-march=skylake-avx512``) scores by widening the bf16 keys, not
    with vdpbf16ps; pinned here on any AVX-512 machine, with bf16 units or not."""
    monkeypatch.setenv("HYBRIDFLOW_KERNEL_MARCH", "skylake-avx512")
    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path))
    assert cpu_kernels.library().paged_decode_attention_bf16_dot_units() == 0
    for shape in ((9, 3, 64), (10, 2, 48), (5, 5, 16)):
        test_cpu_attention.test_the_bf16_kernel_against_fp64_over_the_engines_blocks(*shape)
    test_cpu_attention.test_the_bf16_kernel_is_the_fp32_math_on_the_widened_pool_rounded_once(9, 3, 64, threads=2)
    test_cpu_attention.test_the_bf16_kernel_reads_only_its_rows_positions()
    test_cpu_attention.test_the_bf16_kernel_reads_no_key_past_a_rows_last_position()

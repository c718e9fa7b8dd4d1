"""benchmarks/decode_floor.py: a decode step's FLOPs and bytes by hand, and a tiny profiled run of the engine."""

import pytest

from hybridflow.models.tiny import build_tiny_model
from tests.benchmarks.loader import loaded_benchmark


@pytest.fixture(scope="module")
def bench():
    with loaded_benchmark("decode_floor") as module:
        yield module


def test_step_floor_by_hand(bench):
    """Tiny Llama: hidden 64, MLP 128, 2 layers, 4 heads of 16, 2 KV heads, tied head of V x 64, fp32."""
    model, _ = build_tiny_model("llama")
    vocab = model.config.vocab_size
    per_layer = 64 * 64 + 64 * 32 + 64 * 32 + 64 * 64 + 3 * 64 * 128  # q, k, v, o, gate, up, down
    params = 2 * per_layer + vocab * 64
    floor = bench.step_floor(model, rows=3, context=10, peak=1e9, bandwidth=1e8)
    assert floor["flops"] == 2 * params * 3 + 4 * 2 * 4 * 16 * 10 * 3
    kv_per_token = 2 * 2 * 2 * 16 * 4  # layers x (k, v) x KV heads x head_dim x fp32
    assert floor["bytes"] == 4 * params + 3 * 10 * kv_per_token
    assert floor["compute_s"] == floor["flops"] / 1e9 and floor["memory_s"] == floor["bytes"] / 1e8


def test_a_tiny_profiled_engine_step(bench):
    model, _ = build_tiny_model("llama")
    per_step, split = bench.engine_step(model, rows=2, prompt_len=4, max_tokens=4, profile=True)
    assert per_step > 0 and split["profiled wall s"] > 0
    assert any(key.startswith("matmuls") for key in split)


def test_the_kernel_clock_gives_the_modules_their_library_back(bench):
    """The profiled run patches the kernels' modules in this process; a later test (test_cpu_kernels) clears
    ``cpu_kernels.library`` and must see the modules follow it."""
    from hybridflow.rollout import cpu_attention, cpu_fused, cpu_kernels

    before = (cpu_attention.library, cpu_fused.library, cpu_kernels.library)
    with bench.KernelClock():
        pass
    assert (cpu_attention.library, cpu_fused.library, cpu_kernels.library) == before

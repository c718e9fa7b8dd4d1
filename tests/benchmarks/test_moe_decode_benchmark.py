"""benchmarks/moe_decode.py (issue 58): a tiny run of its engines, what its torch-experts engine switches off, and the
MLA latent's bytes a token of rollout.py's ``kv_bytes_per_token`` against the native engine's allocated pool."""

import pytest

from hybridflow.rollout import cpu_moe
from tests.benchmarks.loader import loaded_benchmark
from tests.models.non_native import build_non_native


@pytest.fixture(scope="module")
def bench():
    with loaded_benchmark("moe_decode") as module:
        yield module


def test_a_tiny_run_prints_each_engines_median_and_its_ratio_to_hf(bench, tmp_path, capsys):
    model, tokenizer = build_non_native("deepseek_v3")
    model.save_pretrained(tmp_path)
    assert bench.main(["--model-path", str(tmp_path), "--batches", "2", "--prompt-len", "5", "--max-tokens", "3",
                       "--rounds", "1", "--threads", "1"]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 2 |")]
    assert len(table) == 1 and table[0].count("x /") == 2  # native and native-torch-experts against HF


def test_the_torch_experts_engine_runs_no_expert_kernel(bench, monkeypatch):
    from hybridflow.rollout.native import NativeEngine

    if cpu_moe.library() is None:
        pytest.skip("no C compiler: the kernels are not built")
    model, tokenizer = build_non_native("deepseek_v3")
    real, calls = cpu_moe.library(), []

    class Counted:
        def __getattr__(self, name):
            calls.extend([name] if name == "moe_experts_f32" else [])
            return getattr(real, name)

    monkeypatch.setattr(cpu_moe, "library", Counted)
    args = bench.parse_args(["--shape", "unused", "--prompt-len", "4", "--max-tokens", "2"])
    requests = bench.synthetic_requests(args, batch=2, vocab_size=model.config.vocab_size)
    for engine, kernel in ((NativeEngine(model, tokenizer), True),
                           (bench.without_expert_kernel(NativeEngine(model, tokenizer)), False)):
        calls.clear()
        bench.run_native(engine, requests, 1.0)
        assert bool(calls) == kernel


def test_engines_must_end_with_hf(bench):
    with pytest.raises(SystemExit):
        bench.parse_args(["--shape", "tiny-olmo2", "--engines", "hf,native"])
    assert bench.parse_args(["--shape", "tiny-olmo2", "--engines", "native,hf"]).engines == ("native", "hf")


def test_kv_bytes_per_token_of_an_mla_model_is_the_pools(bench):
    """DeepSeek-V3 caches ``kv_lora_rank + qk_rope_head_dim`` values a token and layer (16 + 8 here, fp32)."""
    from hybridflow.rollout import SamplingParams
    from hybridflow.rollout.native import NativeEngine

    with loaded_benchmark("rollout") as rollout:
        model, tokenizer = build_non_native("deepseek_v3")
        engine = NativeEngine(model, tokenizer, max_model_len=64)
        engine.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=2))
        pool = engine.pool.cache.data
        per_token = pool.numel() * pool.element_size() // (pool.shape[3] * pool.shape[4])
        assert rollout.kv_bytes_per_token(model) == per_token == 2 * (16 + 8) * 4

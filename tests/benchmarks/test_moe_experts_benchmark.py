"""The MoE experts benchmark's CPU smoke run: a tiny Qwen3-MoE layer through the Triton kernels (interpreted) with two
tile shapes, the eager experts and the bytes floor, one table row per row count and tile shape, the paths agreeing."""

import pytest

from tests.benchmarks.loader import loaded_benchmark

pytest.importorskip("triton")


def test_moe_experts_benchmark_smoke_run(capsys):
    with loaded_benchmark("moe_experts") as module:
        results = module.main(["--smoke", "--tiles", "64x64,128x128"])
    assert [(r["rows"], r["tiles"]) for r in results] == [(1, "64x64"), (1, "128x128"), (5, "64x64"), (5, "128x128")]
    assert results[0]["used"] == 2 and 2 <= results[2]["used"] <= 8  # top-2 of 8 experts
    assert all(r["error"] < 1e-5 and r["floor_us"] > 0 and r["triton_us"] > 0 for r in results)
    out = capsys.readouterr().out
    assert "| rows | tiles n x k | experts used | floor us | triton us | triton / floor |" in out


def test_moe_experts_benchmark_takes_only_moe_shapes():
    with loaded_benchmark("moe_experts") as module:
        with pytest.raises(SystemExit, match="no MoE shape; choose one of .*qwen3-30b-a3b"):
            module.expert_shape("qwen3-0.6b")
        assert module.expert_shape("qwen3-30b-a3b") == dict(hidden=2048, experts=128, intermediate=768, top_k=8,
                                                            renormalize=True, qwen=True)

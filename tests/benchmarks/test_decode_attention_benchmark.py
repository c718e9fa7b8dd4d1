"""benchmarks/decode_attention.py: its smoke run (Triton's interpreter on CPU, compiled on a GPU) reports every
configuration of its sweep correct, the baseline and the best; a configuration that disagrees with the reference is
never timed; the GPU sweep stays small enough to compile and time in gpu_check's minute."""

import subprocess
import sys

import pytest
import torch

from tests.benchmarks.loader import BENCHMARKS, loaded_benchmark

pytest.importorskip("triton")
pytestmark = pytest.mark.triton
interpreted = pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU gpu_check's attn stage runs the script "
                                 "itself; compiling its sweep here would take the CUDA tier's time")


@interpreted
def test_smoke_run_checks_and_times_every_config_against_the_baseline():
    with loaded_benchmark("decode_attention") as bench:
        lines = bench.main(["--smoke"])
        sweeps = {shape.name: len(bench.sweep(bench.choose_config(
            rows=shape.rows, heads=shape.heads, kv_heads=shape.kv_heads, head_dim=shape.head_dim, page=bench.PAGE,
            width=shape.span // bench.PAGE, dtype=torch.bfloat16, sms=132), span=shape.span, full=shape.full_sweep))
            for shape in bench.SMOKE_SHAPES}
    assert "copy bandwidth" in lines[0]
    assert not [line for line in lines if "WRONG" in line or "skipped" in line]
    timed = [line for line in lines if " ms " in line and "x main" in line]
    assert len(timed) == sum(sweeps.values()) and sum("main split256/n64/w4/unrolled/k,v" in line
                                                      for line in timed) == len(sweeps)
    assert sum(line.startswith("best at smoke-") for line in lines) == len(sweeps)
    assert sum("torch SDPA" in line for line in lines) == len(sweeps)
    assert sum("flash_attn" in line for line in lines) == len(sweeps)  # its time, or one line saying it is absent


@interpreted
def test_a_config_that_disagrees_with_the_reference_is_never_timed(monkeypatch):
    with loaded_benchmark("decode_attention") as bench:
        right = bench.reference
        monkeypatch.setattr(bench, "reference", lambda problem: right(problem) + 1.0)
        lines = bench.main(["--smoke", "--shapes", "smoke-gqa3"])
    configs = [line for line in lines if "split" in line and not line.startswith("best")]
    assert configs and all("WRONG" in line and " ms " not in line for line in configs)
    assert not [line for line in lines if line.startswith("best at")]


def test_the_gpu_sweep_is_small_and_starts_from_the_baseline_and_the_chooser():
    """~40 configurations over the five shapes, the two Qwen3 shapes sharing theirs (the same kernels: ~30
    compiles in all); each a whole number of tiles a split, listed once, the baseline first; the Qwen3 sweep
    tries one split a row, each split length, no pipeline, two tiles ahead, V after the softmax, 8 warps, other
    tiles."""
    with loaded_benchmark("decode_attention") as bench:
        sweeps = {}
        for shape in bench.SHAPES:
            chosen = bench.choose_config(rows=shape.rows, heads=shape.heads, kv_heads=shape.kv_heads,
                                         head_dim=shape.head_dim, page=bench.PAGE, width=shape.span // bench.PAGE,
                                         dtype=torch.bfloat16, sms=132)
            sweeps[shape.name] = bench.sweep(chosen, span=shape.span, full=shape.full_sweep)
            assert sweeps[shape.name][:2] == [bench.MAIN_CONFIG, chosen] or chosen == bench.MAIN_CONFIG
        main = bench.MAIN_CONFIG
    assert sweeps["qwen3-nano"] == sweeps["qwen3-1000"] and 12 <= len(sweeps["qwen3-nano"]) <= 16
    assert sum(map(len, sweeps.values())) <= 45
    for configs in sweeps.values():
        assert len(set(configs)) == len(configs)
        assert all(config.split_len % config.block_n == 0 for config in configs)
    qwen3 = sweeps["qwen3-nano"]
    assert {c.split_len for c in qwen3 if not c.unrolled} == {256, 512, 1024, 2048}
    assert {(c.num_stages, c.kv_together, c.num_warps, c.block_n) for c in qwen3} >= {
        (1, True, 4, 64), (5, True, 4, 64), (1, False, 4, 64), (3, True, 8, 64), (3, True, 4, 128), (5, True, 4, 32)}
    assert main.unrolled and not main.kv_together and (main.split_len, main.block_n) == (256, 64)


def test_row_lengths_follow_the_workloads():
    with loaded_benchmark("decode_attention") as bench:
        nano = bench.row_lengths(bench.SHAPES[0])
        fixed = bench.row_lengths(bench.SHAPES[1])
        problem = bench.build_problem(bench.SMOKE_SHAPES[0], dtype=torch.bfloat16, device="cpu", rotate=False)
    assert len(nano) == 256 and min(nano) >= 100 and max(nano) <= 2048 and len(set(nano)) > 200
    assert fixed == [1000] * 256
    lengths = problem.lengths.tolist()
    assert lengths == [1, 150] and problem.live_bytes == 2 * 151 * 2 * 64 * 2  # K and V, 2 KV heads of 64, bf16
    owned = [set(problem.tables[row, :-(-length // 16)].tolist()) for row, length in enumerate(lengths)]
    assert all(0 not in blocks for blocks in owned) and sum(map(len, owned)) == len(set().union(*owned))


def test_without_triton_the_script_skips_in_one_line():
    """gpu_check's ``attn`` stage on an image without Triton: one line, exit 0 (the other stages still run)."""
    script = ("import runpy, sys; sys.modules['triton'] = None; sys.argv = ['decode_attention.py']; "
              "runpy.run_path('benchmarks/decode_attention.py', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=BENCHMARKS.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [done.stdout.strip()] and "skipped, Triton does not import" in done.stdout

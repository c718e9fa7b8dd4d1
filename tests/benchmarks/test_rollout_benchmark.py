"""The rollout benchmark's floor arithmetic (hand-computed) and a tiny end-to-end run of the script."""

import sys

import pytest

from tests.benchmarks.loader import loaded_benchmark


@pytest.fixture(scope="module")
def bench():
    with loaded_benchmark("rollout") as module:
        yield module


def test_decode_rows_per_step_counts_the_responses_still_running(bench):
    # Lengths 1, 3, 3, 5: token 0 of each comes from the prefill; tokens 1 and 2 need steps over
    # the three responses longer than 1 and 2; tokens 3 and 4 only the length-5 one.
    assert bench.decode_rows_per_step([1, 3, 3, 5]) == [3, 3, 1, 1]
    assert bench.decode_rows_per_step([1, 1]) == []


def test_interpolate_is_linear_between_points_and_beyond_the_last(bench):
    curve = {1: 10.0, 3: 30.0, 5: 40.0}
    assert bench.interpolate(curve, 2) == 20.0
    assert bench.interpolate(curve, 4) == 35.0
    assert bench.interpolate(curve, 1) == 10.0
    assert bench.interpolate(curve, 7) == 50.0


def test_fastest_takes_the_best_kernel_and_never_prices_fewer_rows_above_more(bench):
    curves = {"a": {1: 5.0, 2: 4.0, 4: 9.0}, "b": {1: 6.0, 2: 7.0, 4: 8.0}}
    assert bench.fastest(curves) == {1: 4.0, 2: 4.0, 4: 8.0}


def test_step_floor_sums_each_step_and_prefill_at_its_row_count(bench):
    # Steps over 3, 3, 1, 1 rows at 1 s per row, one prompt of 2 tokens: 3 + 3 + 1 + 1 + 2 = 10 s,
    # times 1.5 for attention.
    seconds = bench.step_floor_seconds(curve={1: 1.0, 4: 4.0}, lengths=[1, 3, 3, 5], prompt_lengths=[2],
                                       attention_factor=1.5)
    assert seconds == pytest.approx(15.0)


def test_script_runs_end_to_end_on_a_tiny_model(bench, tiny_model_dir, monkeypatch, capsys):
    monkeypatch.setattr(bench, "ROW_GRID", (1, 2, 4))
    monkeypatch.setattr(sys, "argv", ["rollout.py", "--model-path", tiny_model_dir, "--engines", "native,native-nolanes,hf",
                                      "--step-times",
                                      "--batches", "4,8", "--n", "4", "--max-tokens", "6"])
    bench.main()
    out = capsys.readouterr().out
    assert "batch    8 native / hf:" in out
    assert "step floor:" in out and "flat floor:" in out
    assert "batch    8 native-nolanes step times: 8-15 rows:" in out
    table = [line for line in out.splitlines() if line.startswith("| 8 |")]
    assert len(table) == 1 and table[0].count("%") == 2
    assert "| native TTFT ms | native-nolanes TTFT ms | hf TTFT ms |" in out  # issue 56: time to first token
    ttft = [float(line.split("TTFT ")[1].split(" ms")[0]) for line in out.splitlines() if ", TTFT " in line]
    assert len(ttft) == 6 and all(t > 0 for t in ttft)


def test_continuous_batching_run_keeps_the_slots_and_chunks_hf(bench, tiny_model_dir, monkeypatch, capsys):
    monkeypatch.setattr(bench, "ROW_GRID", (1, 2, 4))
    monkeypatch.setattr(sys, "argv", ["rollout.py", "--model-path", tiny_model_dir, "--engines", "native,hf",
                                      "--step-times", "--batches", "4", "--n", "2", "--max-tokens", "6",
                                      "--requests-per-slot", "3"])
    bench.main()
    out = capsys.readouterr().out
    # 3 x 4 sequences through 4 slots: no native step ever holds more than 4 rows.
    assert "batch    4 native step times:" in out and "8-15 rows" not in out
    assert "batch    4 native:" in out and "batch    4     hf:" in out


def test_synthetic_shapes_run_fixed_rows_against_the_roofline(bench, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["rollout.py", "--shape", "smollm2-135m", "--device", "cpu", "--dtype", "float32",
                                      "--workload", "fixed", "--batches", "2", "--prompt-len", "8",
                                      "--max-tokens", "3", "--engines", "native,hf"])
    bench.main()
    out = capsys.readouterr().out
    assert "batch    2    native: 6 tokens" in out and "batch    2        hf: 6 tokens" in out
    row = [line for line in out.splitlines() if line.startswith("| 2 | native |")]
    assert len(row) == 1 and row[0].endswith("| - |")  # native vs hf ratio present, no hf-static


def test_roofline_bytes_count_weights_per_step_and_each_rows_cache(bench, monkeypatch):
    class Model:  # 2 layers x 2 (k, v) x 1 KV head x 4 dims x 4 bytes = 64 bytes a cached token
        config = type("Config", (), dict(num_hidden_layers=2, num_key_value_heads=1, head_dim=4,
                                         get_text_config=lambda self: self))()  # a text model's config is its own

        def parameters(self):
            return iter([bench.torch.zeros(1)])

    monkeypatch.setattr(sys.modules["rollout_floor"], "weight_bytes", lambda model: 1000)  # where roofline_bytes looks
    requests = [bench.Request([0] * 10, 3), bench.Request([0] * 5, 2)]
    # 2 decode steps (tokens 1 and 2 of the longest row); row 0 reads 11 then 12 cached tokens, row 1 reads 6.
    assert bench.roofline_bytes(Model(), requests) == 2 * 1000 + (11 + 12 + 6) * 64


def test_steady_matmul_rate_skips_the_cold_start_and_takes_the_best_block(bench, monkeypatch):
    """On a fake clock: 5 cold calls of 50 ms, then 10 ms calls, one of them stalled 500 ms by a neighbour. The
    warm-up second holds 5 + 75 calls, so a 0.1 s block is 8 calls; the rate is the 10 ms call's, 2*4*5*6 / 0.01."""
    floor = sys.modules["rollout_floor"]
    now, calls = [0.0], [0]

    def mm(a, b):
        calls[0] += 1
        now[0] += 0.05 if calls[0] <= 5 else 0.5 if calls[0] == 117 else 0.01

    monkeypatch.setattr(floor.torch, "mm", mm)
    monkeypatch.setattr(floor, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: now[0])}))
    assert floor.steady_matmul_flops(4, 5, 6, dtype=floor.torch.float32) == pytest.approx(240 / 0.01, rel=1e-9)
    assert calls[0] == 80 + 5 * 8

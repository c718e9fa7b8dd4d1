"""The multi-turn benchmark runs end to end on a tiny model and both engines agree token for token."""

from tests.benchmarks.loader import loaded_benchmark


def test_multi_turn_benchmark_tiny_run(capsys):
    with loaded_benchmark("multi_turn") as module:
        results = module.main(["--model-path", "tiny", "--conversations", "2", "--turns", "2", "--turn-tokens", "4",
                               "--system-tokens", "40"])
    assert set(results) == {"re-prefill", "prefix reuse"}
    out = capsys.readouterr().out
    assert "same greedy tokens: True" in out
    assert "prefill tokens reused: 0)" in out.splitlines()[1]

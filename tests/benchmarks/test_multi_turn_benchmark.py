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


def test_agent_loop_mode_serves_the_same_tokens_from_batches_and_from_the_queue(capsys):
    with loaded_benchmark("multi_turn") as module:
        results = module.main(["--agent-loops", "--model-path", "tiny", "--conversations", "3", "--turns", "2",
                               "--turn-tokens", "4", "--system-tokens", "40", "--tool-ms", "5"])
    assert set(results) == {"batch", "queue"}
    assert "same greedy tokens: True" in capsys.readouterr().out


def test_agent_plans_draw_turn_lengths_and_tool_latencies_in_their_ranges():
    with loaded_benchmark("multi_turn") as module:
        plans = module.agent_plans(conversations=5, turns=3, turn_tokens=8, tool_ms=40.0)
        again = module.agent_plans(conversations=5, turns=3, turn_tokens=8, tool_ms=40.0)
    assert plans == again and len(plans) == 5 and all(len(plan) == 3 for plan in plans)
    assert all(2 <= tokens <= 16 and 0.0 <= latency <= 0.04 for plan in plans for tokens, latency in plan)
    assert len({tokens for plan in plans for tokens, _ in plan}) > 1  # the turns differ in length

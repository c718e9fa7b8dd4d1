"""The multi-turn benchmark runs end to end on a tiny model and both engines agree token for token."""

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "multi_turn.py"


def test_multi_turn_benchmark_tiny_run(capsys):
    spec = importlib.util.spec_from_file_location("multi_turn_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        results = module.main(["--model-path", "tiny", "--conversations", "2", "--turns", "2", "--turn-tokens", "4",
                               "--system-tokens", "40"])
    finally:
        del sys.modules[spec.name]
    assert set(results) == {"re-prefill", "prefix reuse"}
    out = capsys.readouterr().out
    assert "same greedy tokens: True" in out
    assert "prefill tokens reused: 0)" in out.splitlines()[1]

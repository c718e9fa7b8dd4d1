"""Comparison plots of several runs (python -m hybridflow.trainer.plots)."""

import json

import pytest

from hybridflow.trainer.plots import main as plots_main


def test_comparison_plot_of_several_runs(tmp_path):
    for name, scores in (("a", [0.1, 0.4]), ("b", [0.1, 0.2])):
        logs = tmp_path / name / "logs"
        logs.mkdir(parents=True)
        logs.joinpath("metrics.jsonl").write_text(
            "\n".join(json.dumps({"step": 5 * i, "val-core/x/reward/mean@1": s}) for i, s in enumerate(scores)))
    out = tmp_path / "cmp.png"
    assert plots_main([f"A={tmp_path / 'a'}", f"B={tmp_path / 'b'}", "--metric", "val-core/x/reward/mean@1",
                       "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(FileNotFoundError, match="trainer.logger=\\[console,file\\]"):
        plots_main([f"C={tmp_path / 'missing'}", "--metric", "m", "-o", str(tmp_path / "x.png")])

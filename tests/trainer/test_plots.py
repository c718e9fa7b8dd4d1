"""Comparison plots of several runs (python -m hybridflow.trainer.tracking.plots)."""

import json

import pytest

from hybridflow.trainer.tracking.plots import main as plots_main


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


def test_training_minutes_sum_the_step_times_and_skip_the_validation_rows():
    from hybridflow.trainer.tracking.plots import comparison_series, training_minutes

    history = [{"step": 0, "val-core/x": 0.1}, {"step": 1, "timing_s/step": 30.0},
               {"step": 2, "timing_s/step": 90.0, "val-core/x": 0.2}, {"step": 3, "timing_s/step": 60.0}]
    assert training_minutes(history) == {0: 0.0, 1: 0.5, 2: 2.0, 3: 3.0}
    assert comparison_series({"a": history}, "val-core/x", x="minutes") == {"a": ([0.0, 2.0], [0.1, 0.2])}
    assert comparison_series({"a": history}, "val-core/x") == {"a": ([0, 2], [0.1, 0.2])}


def test_comparison_against_training_minutes(tmp_path):
    logs = tmp_path / "a" / "logs"
    logs.mkdir(parents=True)
    rows = [{"step": 0, "m": 0.1}, {"step": 1, "timing_s/step": 60.0, "m": 0.3}]
    logs.joinpath("metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "cmp.png"
    assert plots_main([f"A={tmp_path / 'a'}", "--metric", "m", "--x", "minutes", "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_runs_of_one_arm_share_a_colour_and_differ_by_dash():
    from hybridflow.trainer.tracking.plots import grouped_styles

    assert grouped_styles(["dynamic s1", "dynamic s2", "plain s1"]) == {
        "dynamic s1": {"color": "C0", "linestyle": "-"}, "dynamic s2": {"color": "C0", "linestyle": "--"},
        "plain s1": {"color": "C1", "linestyle": "-"}}
    assert grouped_styles(["n=4", "n=8"]) == {}  # nothing shared: matplotlib's own colour cycle

"""benchmarks/recipe_ablation.py: run names, the report's table and the exported curves, from metrics files."""

import json
import re
from pathlib import Path

import pytest

from tests.benchmarks.loader import loaded_benchmark


@pytest.fixture(scope="module")
def ablation():
    with loaded_benchmark("recipe_ablation") as module:
        yield module


def write_run(out: Path, name: str, rows: list[dict]) -> None:
    logs = out / "runs" / name / "logs"
    logs.mkdir(parents=True)
    (logs / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_run_names_whose_arm_holds_dots_are_read_back(ablation):
    assert ablation.parse_run("chain_sum_3x2.recipe-t0.6.s12") == {"task": "chain_sum_3x2", "arm": "recipe-t0.6",
                                                                   "seed": 12}
    assert {"recipe-t0.6", "entropy", "dynamic"} <= set(ablation.ARMS)


def test_the_report_averages_seeds_per_validation_step_and_the_export_keeps_the_curves(ablation, tmp_path):
    for seed, late in ((1, 0.3), (2, 0.5)):
        write_run(tmp_path, f"chain_sum_3x2.recipe-t0.6.s{seed}", [
            {"step": 0, "val-core/chain_sum/reward/mean@1": 0.1},
            {"step": 1, "critic/score/mean": 0.25, "actor/entropy": 2.0},
            {"step": 2, "critic/score/mean": 0.5, "actor/entropy": 1.0, "val-core/chain_sum/reward/mean@1": late}])
    table = ablation.report(tmp_path)
    assert "chain_sum_3x2 / recipe-t0.6: 0: 0.100±0.000 (n=2) | 2: 0.400±0.141 (n=2)" in table
    assert "best per seed [(2, 0.3), (2, 0.5)]" in table and "entropy of the last 10 steps [1.5, 1.5]" in table
    ablation.export(tmp_path, tmp_path / "curves.json")
    curves = json.loads((tmp_path / "curves.json").read_text())["chain_sum_3x2.recipe-t0.6.s2"]
    assert curves["arm"] == "recipe-t0.6" and curves["seed"] == 2
    assert curves["held_out"] == {"0": 0.1, "2": 0.5}
    assert curves["per_step"] == {"critic/score/mean": [0.25, 0.5], "actor/entropy": [2.0, 1.0]}


def test_an_export_keeps_the_runs_already_in_the_file_and_names_the_machine(ablation, tmp_path):
    path = tmp_path / "curves.json"
    path.write_text(json.dumps({"old.plain.s1": {"held_out": {"0": 0.2}}, "a.plain.s1": {"held_out": {"0": 0.9}}}))
    write_run(tmp_path, "a.plain.s1", [{"step": 0, "val-core/x": 0.1}])
    ablation.record_machine(tmp_path / "runs" / "a.plain.s1", threads=1)
    ablation.export(tmp_path, path)
    runs = json.loads(path.read_text())
    assert list(runs) == ["a.plain.s1", "old.plain.s1"]
    assert runs["old.plain.s1"] == {"held_out": {"0": 0.2}}
    assert runs["a.plain.s1"]["held_out"] == {"0": 0.1}  # exported again: replaced
    assert runs["a.plain.s1"]["machine"].endswith("; 1 thread(s) a run") and "ISA" in runs["a.plain.s1"]["machine"]


def test_plots_count_a_held_still_step_at_the_median(ablation, tmp_path):
    run = {"task": "t", "arm": "plain", "seed": 1, "held_out": {"0": 0.1, "3": 0.4},
           "per_step": {"timing_s/step": [30.0, 600.0, 60.0]}}
    assert ablation.history_of(run) == [{"step": 1, "timing_s/step": 30.0}, {"step": 2, "timing_s/step": 60.0},
                                        {"step": 3, "timing_s/step": 60.0}, {"step": 0, "held-out score": 0.1},
                                        {"step": 3, "held-out score": 0.4}]
    exported = tmp_path / "curves.json"
    exported.write_text(json.dumps({"t.plain.s1": run, "t.other.s1": {**run, "arm": "other"}}))
    assert ablation.plot(exported, tmp_path / "none", ["t"], ["dynamic"]) == []
    paths = ablation.plot(exported, tmp_path / "plots", ["t"], ["plain"])
    assert [Path(p).name for p in paths] == ["recipe_t_step.png", "recipe_t_minutes.png"]


def test_breakdown_scores_each_kind_of_question(ablation, tmp_path):
    prompt = "user\nState the final answer to the following arithmetic problem: {} = Reply with only the final answer."
    rows = [("82 - 60 + 95", 0.0), ("7 + 0 + 5", 1.0), ("9 + 8 + 7", 0.0), ("59 - 32", 1.0)]
    dump = tmp_path / "60.jsonl"
    dump.write_text("".join(json.dumps({"input": prompt.format(q), "score": s}) + "\n" for q, s in rows))
    assert ablation.question_kind(prompt.format("36 - 64 - 7")) == "3 terms of 2 digits"
    assert ablation.breakdown([dump]).splitlines()[1:] == [
        "2 terms of 2 digits | 1 / 1 = 1.00",
        "3 terms of 1 digit | 1 / 2 = 0.50",
        "3 terms of 2 digits | 0 / 1 = 0.00",
        "all | 2 / 4 = 0.50",
    ]
    # running sums left to right: 82, 22, 117 / 7, 7, 12 / 9, 17, 24 / 59, 27 -- none below zero
    assert ablation.breakdown([dump], "sign").splitlines()[1:] == ["running sum stays >= 0 | 2 / 4 = 0.50",
                                                                   "all | 2 / 4 = 0.50"]


def test_the_sign_breakdown_follows_the_running_sum_not_the_answer(ablation):
    """"3 - 6 - 8": 3, -3, -11 goes below zero; "6 - 8 + 9": 6, -2, 7 does too though the answer is positive;
    "9 - 9 + 0": 9, 0, 0 does not (zero is not below)."""
    prompt = "user\nState the final answer to the following arithmetic problem: {} = Add the numbers one at a time."
    assert ablation.running_sum_sign(prompt.format("3 - 6 - 8")) == "running sum goes below 0"
    assert ablation.running_sum_sign(prompt.format("6 - 8 + 9")) == "running sum goes below 0"
    assert ablation.running_sum_sign(prompt.format("9 - 9 + 0")) == "running sum stays >= 0"


def test_a_task_can_replace_the_instruction_and_keep_the_questions(ablation, tmp_path):
    """chain_sum_3x2_drawn_steps is chain_sum_3x2_drawn with the steps instruction: same held-out questions."""
    import pandas as pd

    with loaded_benchmark("instruction_probe") as probe:
        questions = {}
        for task, instruction in (("chain_sum_3x2_drawn", ablation.INSTRUCTION),
                                  ("chain_sum_3x2_drawn_steps", ablation.STEPS_INSTRUCTION)):
            test = ablation.prepare_task(task, tmp_path) / "test.parquet"
            contents = [row[-1]["content"] for row in pd.read_parquet(test)["prompt"]]
            assert all(c.endswith(instruction) for c in contents) and len(contents) == 132
            rows = probe.load_questions(str(test), instruction)
            assert all(row["question"].endswith("=") and row["data_source"] == "chain_sum" for row in rows)
            questions[task] = [row["question"] for row in rows]
    assert questions["chain_sum_3x2_drawn"] == questions["chain_sum_3x2_drawn_steps"]


def test_the_probe_runs_end_to_end_on_the_rollout_engine(ablation, tmp_path, tiny_model_dir):
    """A tiny random model through the probe: every question answered (by prompt index) and graded by kind."""
    import pandas as pd

    from hybridflow.models import load_causal_lm, load_tokenizer
    from hybridflow.rollout import build_engine

    test = ablation.prepare_task("chain_sum_3x2_drawn", tmp_path) / "test.parquet"
    pd.read_parquet(test).head(6).to_parquet(tmp_path / "six.parquet")
    tokenizer = load_tokenizer(tiny_model_dir)
    engine = build_engine("native", load_causal_lm(tiny_model_dir).eval(), tokenizer)
    with loaded_benchmark("instruction_probe") as probe:
        rows = probe.load_questions(str(tmp_path / "six.parquet"), ablation.INSTRUCTION)
        answers = probe.answer_all(engine, tokenizer, ["1 +", "2 +", "3 +"], max_new_tokens=3, stop_token_ids=[])
        report = probe.probe(engine, tokenizer, rows, ablation.STEPS_INSTRUCTION, max_new_tokens=3,
                             stop_token_ids=[])
    assert len(answers) == 3 and all(answers)  # no prompt left without its answer
    kinds = ablation.scores_by_kind((row["question"], 0.0) for row in rows)
    first, by_kind = report.splitlines()[:2]
    assert "over 6 questions" in first and ablation.STEPS_INSTRUCTION in first
    assert re.findall(r"(\d+ terms of \d+ digits?) \d\.\d\d \((\d+)\)", by_kind) == [
        (kind, str(len(scores))) for kind, scores in sorted(kinds.items())]


def test_an_sft_arm_warms_up_once_on_worked_sums_then_trains_as_its_arm(ablation, tmp_path, tiny_model_dir,
                                                                       monkeypatch):
    """The sft- arms: the real SFT entry point on the tiny model, its worked-sum traces, reused by a second arm."""
    import pandas as pd

    assert ablation.arm_overrides("sft-dynamic-len64") == ablation.ARMS["dynamic-len64"]
    monkeypatch.setattr(ablation, "WARMUP_TRACES", 32)  # 2 steps of 16
    ablation.prepare_task("chain_sum_3x1d_steps", tmp_path)
    model = ablation.warm_up(out=tmp_path, task="chain_sum_3x1d_steps", seed=3, threads=1, model=str(tiny_model_dir))
    folder = tmp_path / "warmup" / "chain_sum_3x1d_steps.s3"
    assert model == str(folder / "global_step_2" / "model" / "huggingface")
    assert (Path(model) / "config.json").exists()
    traces = pd.read_parquet(folder / "traces.parquet")["messages"]
    assert len(traces) == 32 and traces[0][-1]["content"].endswith(".") and "The final answer is" in traces[0][-1]["content"]
    assert traces[0][0]["content"].endswith(ablation.STEPS_INSTRUCTION)
    log = (folder / "run.log").read_text()
    assert ablation.warm_up(out=tmp_path, task="chain_sum_3x1d_steps", seed=3, threads=1,
                            model=str(tiny_model_dir)) == model
    assert (folder / "run.log").read_text() == log  # the second arm reuses the warm-up


def test_an_sft_arm_is_plotted_from_where_its_warm_up_ended(ablation, tmp_path):
    """The export records the warm-up's minutes; against the minutes the arm's step 0 sits at their end."""
    from hybridflow.trainer.tracking.plots import comparison_series

    write_run(tmp_path, "t.sft-plain.s1", [{"step": 0, "val-core/x": 0.5}, {"step": 1, "timing_s/step": 60.0},
                                          {"step": 2, "timing_s/step": 30.0, "val-core/x": 0.75}])
    write_run(tmp_path, "t.plain.s1", [{"step": 0, "val-core/x": 0.1}, {"step": 1, "timing_s/step": 60.0,
                                                                         "val-core/x": 0.2}])
    warmup_logs = tmp_path / "warmup" / "t.s1" / "logs"
    warmup_logs.mkdir(parents=True)
    warmup_logs.joinpath("metrics.jsonl").write_text('{"step": 1, "timing_s/step": 120.0}\n'
                                                     '{"step": 2, "timing_s/step": 60.0}\n')
    ablation.export(tmp_path, tmp_path / "curves.json")
    runs = json.loads((tmp_path / "curves.json").read_text())
    assert runs["t.sft-plain.s1"]["warmup_minutes"] == 3.0 and "warmup_minutes" not in runs["t.plain.s1"]
    histories = {name: ablation.history_of(run) for name, run in runs.items()}
    by_minutes = comparison_series(histories, ablation.HELD_OUT, x="minutes")
    assert by_minutes["t.sft-plain.s1"] == ([3.0, 4.5], [0.5, 0.75])
    assert by_minutes["t.plain.s1"] == ([0.0, 1.0], [0.1, 0.2])
    assert comparison_series(histories, ablation.HELD_OUT)["t.sft-plain.s1"] == ([0, 2], [0.5, 0.75])


@pytest.mark.parametrize("preset, task, arm", [("reasoning", "chain_sum_3x2_drawn", "dynamic"),
                                               ("reasoning-sft", "chain_sum_3x1d_steps", "sft-dynamic-len64")])
def test_a_reasoning_preset_runs_the_job_its_docs_measured(ablation, preset, task, arm):
    """docs/recipes.md measures the presets with the sweep: the same questions, instruction, PPO settings and
    warm-up (the sweep adds only its own bookkeeping: logging, base validation, no reward timeout)."""
    with loaded_benchmark("demo_presets") as presets:
        demo = presets.PRESETS[preset]
    name, config, test_size, flags = ablation.TASKS[task]
    assert (demo.task, list(demo.task_config), demo.test_size, demo.test_as_drawn) == (
        name, config, test_size, "--test_as_drawn" in flags)
    assert demo.train_size == 1024
    instruction = flags[flags.index("--instruction") + 1] if "--instruction" in flags else ablation.INSTRUCTION
    assert demo.instruction == instruction
    sweep = dict(o.split("=", 1) for o in [*ablation.PLAIN, *ablation.arm_overrides(arm)])  # the later one wins
    demo_overrides = dict(o.split("=", 1) for o in demo.overrides)
    bookkeeping = {"reward_model.timeout_s", "trainer.val_before_train", "trainer.logger"}
    assert {k: v for k, v in sweep.items() if k not in bookkeeping} == {
        k: demo_overrides.get(k) for k in sweep if k not in bookkeeping}
    assert (demo.warmup is not None) == arm.startswith(ablation.WARMUP_PREFIX)
    if demo.warmup is not None:
        assert (demo.warmup.traces, demo.warmup.overrides) == (ablation.WARMUP_TRACES, ablation.WARMUP_SFT_OVERRIDES)

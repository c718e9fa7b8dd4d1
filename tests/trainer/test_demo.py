"""The demo entry point: the tiny preset end to end (shortened here; `make demo` runs the real one)."""

import pytest

from hybridflow.cli import main
from hybridflow.trainer.demo import PRESETS, before_after, report, run_demo


def test_tiny_demo_runs_and_reports_before_after(tmp_path, capsys):
    assert main(["demo", "--preset", "tiny", "--out", str(tmp_path / "run"), "trainer.total_training_steps=3",
                 "trainer.test_freq=3"]) == 0
    out = capsys.readouterr().out
    assert "[demo] held-out val-core/hybridflow/digits/reward/mean@1:" in out
    assert (tmp_path / "run" / "plots" / "reward.png").exists()
    assert (tmp_path / "run" / "data" / "test.parquet").exists()


@pytest.mark.slow
def test_tiny_demo_learns(tmp_path):
    result = run_demo("tiny", str(tmp_path / "run"), [])
    assert result["before"] < 0.5 and result["after"] > 0.9


def test_before_after_reads_the_first_and_last_validation():
    history = [{"step": 0, "val-core/x/reward/mean@1": 0.25}, {"step": 1, "critic/score/mean": 0.5},
               {"step": 2, "val-core/x/reward/mean@1": 0.75}]
    assert before_after(history) == ("val-core/x/reward/mean@1", 0.25, 0.75)
    assert set(PRESETS) == {"default", "tiny", "tools", "tools-tiny", "reasoning", "reasoning-sft",
                            "reasoning-sft-tiny"}


def test_report_names_the_best_validation_when_the_run_ended_below_it(capsys):
    key = "val-core/x/reward/mean@1"
    history = [{"step": 0, key: 0.1}, {"step": 10, key: 0.3}, {"step": 20, key: 0.3}, {"step": 30, key: 0.2}]
    result = report(history, base=None, steps=30, seconds=60)
    assert (result["best_step"], result["best"]) == (10, 0.3)  # the first of equal scores
    assert "best held-out val-core/x/reward/mean@1: 0.300 at step 10" in capsys.readouterr().out
    assert "best" not in report(history[:3], base=None, steps=20, seconds=60)  # the last is the best


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_a_valid_config(tmp_path, name):
    from hybridflow.config import PPOConfig, load_config
    from hybridflow.trainer.demo import demo_overrides

    overrides = demo_overrides(PRESETS[name], model="m", train="t.parquet", test="v.parquet", run_dir=str(tmp_path))
    cfg = load_config(PPOConfig, overrides)
    assert cfg.trainer.total_training_steps > 0


def test_report_reads_the_tool_call_share_of_the_validations(capsys):
    history = [{"val-core/x/reward/mean@1": 0.25, "val-aux/tool_call_share@1": 0.5},
               {"val-core/x/reward/mean@1": 0.75, "val-aux/tool_call_share@1": 0.875}]
    base = [{"val-core/x/reward/mean@1": 0.0, "val-aux/tool_call_share@1": 0.0}]
    result = report(history, base=base, steps=2, seconds=60)
    assert result == {"before": 0.25, "after": 0.75, "tool_share_before": 0.5, "tool_share_after": 0.875,
                      "base": 0.0, "tool_share_base": 0.0}
    assert "(val-aux/tool_call_share@1): 0.500 -> 0.875" in capsys.readouterr().out


def test_tools_tiny_demo_warms_up_on_tool_traces_then_trains_with_the_tool(tmp_path, capsys):
    """--preset tools end to end on the tiny model: tool-agent rows, tools.yaml, SFT traces in the format the
    tool agent parses (the tool turn is the calculator's real reply), base validation, GRPO, the summary."""
    import json

    import pandas as pd

    from hybridflow.tools.calculator import evaluate, format_number
    from hybridflow.tools.parsers import parse_hermes

    run = tmp_path / "run"
    assert main(["demo", "--preset", "tools-tiny", "--out", str(run), "trainer.total_training_steps=1",
                 "trainer.test_freq=1"]) == 0
    out = capsys.readouterr().out
    assert "[demo] held-out answers that called a tool (val-aux/tool_call_share@1):" in out
    assert "[demo] base model before the SFT warm-up:" in out
    assert "CalculatorTool" in (run / "tools.yaml").read_text()
    row = pd.read_parquet(run / "data" / "train.parquet").iloc[0]
    assert row["agent_name"] == "tool_agent" and "calculator" in row["extra_info"]["tools_kwargs"]
    trace = pd.read_parquet(run / "data" / "sft_traces.parquet").iloc[0]
    messages = list(trace["messages"])
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    (call,) = parse_hermes(messages[2]["content"]).calls
    assert call.name == "calculator" and json.loads(trace["tools"])[0]["function"]["name"] == "calculator"
    assert messages[3]["content"] == messages[4]["content"] == format_number(evaluate(call.arguments["expression"]))
    assert messages[4]["content"] == row["reward_model"]["ground_truth"]
    assert (run / "sft" / "global_step_1" / "model" / "huggingface" / "config.json").exists()
    assert (run / "base" / "generations" / "0.jsonl").exists() and (run / "generations" / "1.jsonl").exists()


def test_reasoning_sft_tiny_demo_warms_up_on_worked_sums_then_trains(tmp_path, capsys):
    """--preset reasoning-sft end to end on the tiny model: the steps instruction, worked-sum traces of the
    first training questions, base validation, the SFT, GRPO from its model, the three scores in the summary."""
    import pandas as pd

    from hybridflow.data.preprocess.worked_sums import STEPS_INSTRUCTION

    run = tmp_path / "run"
    assert main(["demo", "--preset", "reasoning-sft-tiny", "--out", str(run), "trainer.test_freq=2"]) == 0
    out = capsys.readouterr().out
    assert "[demo] base model before the SFT warm-up: val-core/chain_sum/reward/mean@1" in out
    assert "tool-call share" not in out
    rows = pd.read_parquet(run / "data" / "train.parquet")
    traces = pd.read_parquet(run / "data" / "sft_traces.parquet")["messages"]
    assert len(traces) == 8
    for row, trace in zip(rows.itertuples(), traces):
        assert list(trace[:-1]) == list(row.prompt) and row.prompt[-1]["content"].endswith(STEPS_INSTRUCTION)
        assert trace[-1]["content"].endswith(f"The final answer is {row.reward_model['ground_truth']}.")
    assert (run / "sft" / "global_step_1" / "model" / "huggingface" / "config.json").exists()
    assert "data.max_response_length=64" in out and "algorithm.filter_groups.enable=True" in out
    assert (run / "base" / "generations" / "0.jsonl").exists() and (run / "generations" / "2.jsonl").exists()


def test_warmup_traces_call_the_tool_every_nth_question_and_end_on_the_right_answer(tmp_path):
    import pandas as pd

    from hybridflow.errors import DataError
    from hybridflow.trainer.demo import TOOL_TASK
    from hybridflow.trainer.demo_tools import write_tool_config, write_tool_rows, write_warmup_traces

    train, _ = write_tool_rows(task="basic_arithmetic", task_config=TOOL_TASK, train_size=6, test_size=2,
                               tool="calculator", system_prompt="Use the tool.", out=str(tmp_path / "data"))
    config = write_tool_config(str(tmp_path), ("hybridflow.tools.calculator.CalculatorTool",))
    traces = pd.read_parquet(write_warmup_traces(train, config, str(tmp_path), count=6, tool_every=3))
    with_tool, direct = ["system", "user", "assistant", "tool", "assistant"], ["system", "user", "assistant"]
    assert [[m["role"] for m in t] for t in traces["messages"]] == [with_tool, direct, direct] * 2
    truths = [row["ground_truth"] for row in pd.read_parquet(train)["reward_model"]]
    assert [t[-1]["content"] for t in traces["messages"]] == truths
    rows = pd.read_parquet(train)
    rows.at[0, "extra_info"] = {**rows.at[0, "extra_info"], "metadata": "{}"}
    rows.to_parquet(train)
    with pytest.raises(DataError, match="no extra_info.metadata.expression"):
        write_warmup_traces(train, config, str(tmp_path), count=1)


def test_a_preset_can_keep_its_held_out_questions_as_drawn(tmp_path):
    """``test_as_drawn``: the held-out draws all stay (the default keeps only those training never drew)."""
    from dataclasses import replace

    import pandas as pd

    from hybridflow.trainer.demo import prepare_data

    def sizes(preset, folder):
        train, test = (pd.read_parquet(path) for path in prepare_data(preset, str(tmp_path / folder)))
        questions = [row[0]["content"] for row in test["prompt"]]
        assert not set(questions) & {row[0]["content"] for row in train["prompt"]}
        return len(train), len(questions)

    preset = replace(PRESETS["default"], train_size=128, test_size=40)  # ~200 distinct questions: overlap is sure
    default_train, default_test = sizes(preset, "default")
    drawn_train, drawn_test = sizes(replace(preset, test_as_drawn=True), "drawn")
    assert default_train == 128 and default_test < drawn_test
    assert drawn_train < 128 and drawn_test > 30

"""The demo's experiment presets (benchmarks/demo_presets.py): tools and the worked-sum warm-up, end to end on the
tiny model, and every preset a valid config."""

import pytest

from tests.benchmarks.loader import loaded_benchmark


@pytest.fixture(scope="module")
def presets():
    with loaded_benchmark("demo_presets") as module:
        yield module


def main(presets, argv):
    """``python benchmarks/demo_presets.py ARGV`` in this process."""
    return presets._main(argv)


def test_every_experiment_preset_is_a_valid_config(presets, tmp_path):
    from hybridflow.config import PPOConfig, load_config

    assert set(presets.PRESETS) == {"tools", "tools-tiny", "reasoning", "reasoning-sft", "reasoning-sft-tiny"}
    for name, preset in presets.PRESETS.items():
        agent = tuple(presets.tool_overrides(str(tmp_path / "tools.yaml"))) if preset.tools else ()
        overrides = presets.demo_overrides(preset, model="m", train="t.parquet", test="v.parquet",
                                           run_dir=str(tmp_path), agent=agent)
        assert load_config(PPOConfig, overrides).trainer.total_training_steps > 0, name


def test_report_reads_the_tool_call_share_of_the_validations(presets, capsys):
    history = [{"val-core/x/reward/mean@1": 0.25, "val-aux/tool_call_share@1": 0.5},
               {"val-core/x/reward/mean@1": 0.75, "val-aux/tool_call_share@1": 0.875}]
    base = [{"val-core/x/reward/mean@1": 0.0, "val-aux/tool_call_share@1": 0.0}]
    result = presets.report_extras(history, base=base)
    assert result == {"tool_share_before": 0.5, "tool_share_after": 0.875,
                      "base": 0.0, "tool_share_base": 0.0}
    assert "(val-aux/tool_call_share@1): 0.500 -> 0.875" in capsys.readouterr().out


def test_tools_tiny_demo_warms_up_on_tool_traces_then_trains_with_the_tool(presets, tmp_path, capsys):
    """--preset tools end to end on the tiny model: tool-agent rows, tools.yaml, SFT traces in the format the
    tool agent parses (the tool turn is the calculator's real reply), base validation, GRPO, the summary."""
    import json

    import pandas as pd

    from hybridflow.tools.calculator import evaluate, format_number
    from hybridflow.tools.parsers import parse_hermes

    run = tmp_path / "run"
    assert main(presets, ["--preset", "tools-tiny", "--out", str(run), "trainer.total_training_steps=1",
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


def test_reasoning_sft_tiny_demo_warms_up_on_worked_sums_then_trains(presets, tmp_path, capsys):
    """--preset reasoning-sft end to end on the tiny model: the steps instruction, worked-sum traces of the
    first training questions, base validation, the SFT, GRPO from its model, the three scores in the summary."""
    import pandas as pd

    from hybridflow.data.preprocess.worked_sums import STEPS_INSTRUCTION

    run = tmp_path / "run"
    assert main(presets, ["--preset", "reasoning-sft-tiny", "--out", str(run), "trainer.test_freq=2"]) == 0
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


def test_warmup_traces_call_the_tool_every_nth_question_and_end_on_the_right_answer(presets, tmp_path):
    import pandas as pd

    from hybridflow.errors import DataError
    TOOL_TASK, write_tool_config = presets.TOOL_TASK, presets.write_tool_config
    write_tool_rows, write_warmup_traces = presets.write_tool_rows, presets.write_warmup_traces

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

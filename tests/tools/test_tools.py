"""Built-in tools and the tool-config YAML."""

import asyncio

import pytest

from hybridflow.errors import ConfigError, DataError
from hybridflow.tools import load_tools
from hybridflow.tools.answer_check import AnswerCheckTool
from hybridflow.tools.calculator import CalculatorTool, evaluate
from hybridflow.tools.code_interpreter import CodeInterpreterTool


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("expression, value", [("1+2*3", 7), ("(1+2)*3", 9), ("7/2", 3.5), ("7//2", 3),
                                               ("-2**3", -8), ("10 % 4", 2), ("1.5*2", 3.0)])
def test_calculator_arithmetic(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize("expression", ["__import__('os')", "x+1", "9**9**9", "abs(-1)", "1/0", "1 +"])
def test_calculator_rejects_everything_but_arithmetic_with_a_message(expression):
    response, reward, metrics = run(CalculatorTool().execute("id", {"expression": expression}))
    assert response.text.startswith("Error: cannot evaluate") and metrics == {"ok": 0.0}


def test_calculator_formats_integral_floats_as_integers():
    assert run(CalculatorTool().execute("id", {"expression": "6.0*7"}))[0].text == "42"


def test_answer_check_lifecycle_and_penalty_for_no_improvement():
    async def scenario():
        tool = AnswerCheckTool()
        instance, _ = await tool.create(None, create_kwargs={"ground_truth": "42"})
        wrong = await tool.execute(instance, {"answer": "41"})
        right = await tool.execute(instance, {"answer": "42"})
        again = await tool.execute(instance, {"answer": "42"})
        reward = await tool.calc_reward(instance)
        await tool.release(instance)
        return wrong[1], right[1], again[1], reward, tool.instances

    wrong, right, again, reward, left = run(scenario())
    assert (wrong, right, again, reward) == (-0.05, 0.0, -0.05, 1.0)  # verl: -0.05 unless the score improves
    assert left == {}


def test_answer_check_without_ground_truth_names_the_row_field():
    with pytest.raises(DataError, match="tools_kwargs.calc_gsm8k_reward.create_kwargs.ground_truth"):
        run(AnswerCheckTool().create(None, create_kwargs={}))


def test_code_interpreter_runs_in_the_sandbox():
    tool = CodeInterpreterTool(config={"timeout_s": 5})
    assert run(tool.execute("id", {"code": "print(6*7)"}))[0].text.strip() == "42"
    text = run(tool.execute("id", {"code": "raise ValueError('boom')"}))[0].text
    assert "ValueError: boom" in text and "exit code 1" in text


def write(tmp_path, text):
    path = tmp_path / "tools.yaml"
    path.write_text(text)
    return str(path)


def test_tool_config_with_verl_class_path_and_schema(tmp_path):
    path = write(tmp_path, """
tools:
  - class_name: verl.tools.gsm8k_tool.Gsm8kTool
    config: {type: native}
    tool_schema:
      type: function
      function:
        name: calc_gsm8k_reward
        description: check
        parameters: {type: object, properties: {answer: {type: string}}, required: [answer]}
  - class_name: hybridflow.tools.calculator.CalculatorTool
""")
    tools = load_tools(path)
    assert [type(t).__name__ for t in tools] == ["AnswerCheckTool", "CalculatorTool"]
    assert [t.name for t in tools] == ["calc_gsm8k_reward", "calculator"]
    assert tools[0].tool_schema["function"]["description"] == "check"


@pytest.mark.parametrize("text, message", [
    ("tools: []", "non-empty list under 'tools:'"),
    ("tools:\n  - config: {}", "needs a class_name"),
    ("tools:\n  - class_name: no.such.Tool", "cannot import class_name 'no.such.Tool'"),
    ("tools:\n  - class_name: hybridflow.tools.calculator.CalculatorTool\n"
     "  - class_name: hybridflow.tools.calculator.CalculatorTool", "tool names must be unique"),
    ("tools:\n  - class_name: hybridflow.tools.calculator.CalculatorTool\n    tool_schema: {type: function}",
     "OpenAI function schema"),
    *[(f"tools:\n  - class_name: hybridflow.tools.calculator.CalculatorTool\n    tool_schema: {{type: function, "
       f"function: {{name: calc, parameters: {parameters}}}}}",
       f"^CalculatorTool: tool 'calc' has tool_schema.function.parameters=.*, which is not a JSON schema of the "
       f"arguments: {problem}; write {{type: object") for parameters, problem in [  # issue 50: these were silent
        ("the expression", "it is a str, not a mapping"),
        ("[expression]", "it is a list, not a mapping"),
        ("{type: string}", "its type is 'string'; the arguments are an object"),
        ("{type: object, properties: [expression]}", "properties must map each argument name to its schema"),
        ("{type: object, properties: {expression: string}}", "properties must map each argument name to its schema"),
        ("{type: object, properties: {x: {type: number}}, required: [y]}",
         r"required=\['y'\] must list argument names of properties"),
    ]],
])
def test_bad_tool_configs_are_one_clear_error(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load_tools(write(tmp_path, text))


def test_a_tool_without_parameters_gets_an_empty_object_schema(tmp_path):
    text = ("tools:\n  - class_name: hybridflow.tools.calculator.CalculatorTool\n    tool_schema: {type: function, "
            "function: {name: calc, parameters: null}}")
    (tool,) = load_tools(write(tmp_path, text))
    assert tool.tool_schema["function"]["parameters"] == {"type": "object", "properties": {}}


def test_missing_tool_config_file_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match="multi_turn.tool_config_path"):
        load_tools(str(tmp_path / "nope.yaml"))


def test_verl_s_geo3k_tool_config_loads_and_scores_answers_as_verl_s_geo3k_tool():
    """verl's examples/sglang_multiturn/config/tool_config/geo3k_tool_config.yaml, unchanged: its Geo3kTool is the
    built-in geo3k answer check (the submitted answer itself, no box, no format score; -0.05 for no improvement)."""
    import asyncio
    import pathlib

    config = pathlib.Path(__file__).parents[1] / "verl_commands" / "configs" / "geo3k_tool_config.yaml"
    (tool,) = load_tools(str(config))
    assert type(tool).__name__ == "Geo3kAnswerCheckTool" and tool.name == "calc_geo3k_reward"

    async def submit_twice():
        instance, _ = await tool.create(None, create_kwargs={"ground_truth": "12"})
        first = await tool.execute(instance, {"answer": "12"})
        second = await tool.execute(instance, {"answer": "13"})
        return first, second, await tool.calc_reward(instance)

    (first_text, first_step, _), (_, second_step, _), reward = asyncio.run(submit_twice())
    assert "reward=1.0" in first_text.text and first_step == 0.0
    assert second_step == -0.05 and reward == 0.0  # the last answer is the conversation's (verl's rule)

"""Tool-call parsing: valid, several per turn, malformed (each an error message, never an exception)."""

import pytest

from hybridflow.errors import ConfigError
from hybridflow.tools import ToolCall, get_tool_parser

hermes = get_tool_parser("hermes")


def test_hermes_reads_one_call_and_keeps_the_text():
    turn = hermes('Let me add. <tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call>')
    assert turn.calls == [ToolCall(name="calculator", arguments={"expression": "1+2"})]
    assert turn.content == "Let me add. " and turn.errors == []


def test_hermes_reads_several_calls_in_order():
    text = ('<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call> and '
            '<tool_call>{"name": "b", "arguments": "{\\"y\\": 2}"}</tool_call>')
    turn = hermes(text)
    assert turn.calls == [ToolCall("a", {"x": 1}), ToolCall("b", {"y": 2})]  # string arguments are decoded


@pytest.mark.parametrize("body, message", [
    ('{"name": "a", "arguments": {', "not valid JSON"),
    ('{"arguments": {}}', 'with a "name" string'),
    ('["a"]', 'with a "name" string'),
    ('{"name": "a", "arguments": [1, 2]}', "must be a JSON object"),
    ('{"name": "a", "arguments": "not json"}', "is a string that is not a JSON object"),
])
def test_hermes_malformed_call_is_an_error_not_an_exception(body, message):
    turn = hermes(f"<tool_call>{body}</tool_call>")
    assert turn.calls == [] and len(turn.errors) == 1 and message in turn.errors[0]


def test_hermes_unclosed_call_and_good_call_together():
    turn = hermes('<tool_call>{"name": "a", "arguments": {}}</tool_call> <tool_call>{"name": "b"')
    assert turn.calls == [ToolCall("a", {})] and "not closed" in turn.errors[0]


def test_plain_answer_has_no_calls():
    assert hermes("The answer is 42.").calls == [] and hermes("The answer is 42.").errors == []


def test_llama3_json_calls_and_plain_answers():
    parse = get_tool_parser("llama3_json")
    turn = parse('<|python_tag|>{"name": "a", "parameters": {"q": "x;y"}}; {"name": "b", "parameters": {}}<|eom_id|>')
    assert turn.calls == [ToolCall("a", {"q": "x;y"}), ToolCall("b", {})]
    assert parse("just text").calls == []
    assert "not valid JSON" in parse('{"name": "a", "parameters": {').errors[0]


def test_unknown_format_lists_the_known_ones():
    with pytest.raises(ConfigError, match="hermes, llama3_json"):
        get_tool_parser("xml")

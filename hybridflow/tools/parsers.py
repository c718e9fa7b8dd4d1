"""Finding tool calls in a generated turn (verl's ``multi_turn.format``).

A parser turns the decoded text of one assistant turn into a ``ParsedTurn``: the calls it
could read and one error message per call it could not (bad JSON, no name, arguments that
are not an object, an unterminated tag). The agent loop sends those errors back to the
model as tool turns, so a malformed call costs a turn, never the run.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from hybridflow.errors import ConfigError


@dataclass
class ToolCall:
    """One call: the tool's name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedTurn:
    """A turn's text without the calls, the calls that parsed, and an error per call that did not."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


TOOL_PARSERS: dict[str, Callable[[str], ParsedTurn]] = {}
CALL_END_STRINGS: dict[str, str] = {}
"""Per format, the text that closes a call (a stop string when a turn should end at its first call)."""


def register_tool_parser(name: str, *, call_end: str | None = None):
    def wrap(fn):
        TOOL_PARSERS[name] = fn
        if call_end:
            CALL_END_STRINGS[name] = call_end
        return fn

    return wrap


def list_tool_parsers() -> list[str]:
    return sorted(TOOL_PARSERS)


def get_tool_parser(name: str) -> Callable[[str], ParsedTurn]:
    if name not in TOOL_PARSERS:
        raise ConfigError(f"actor_rollout_ref.rollout.multi_turn.format={name!r} is not one of "
                          f"{', '.join(list_tool_parsers())}")
    return TOOL_PARSERS[name]


def call_from_json(text: str, *, arguments_key: str) -> ToolCall | str:
    """``{"name": ..., arguments_key: {...}}`` -> a ToolCall, or the reason it is not one."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        return f"the tool call is not valid JSON ({err.msg} at char {err.pos}): {text.strip()[:200]}"
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return f'a tool call must be a JSON object with a "name" string, got: {text.strip()[:200]}'
    arguments = obj.get(arguments_key, {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return f'the "{arguments_key}" of the call to {obj["name"]} is a string that is not a JSON object'
    if not isinstance(arguments, dict):
        return f'the "{arguments_key}" of the call to {obj["name"]} must be a JSON object, got {arguments!r}'
    return ToolCall(name=obj["name"], arguments=arguments)


HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@register_tool_parser("hermes", call_end="</tool_call>")
def parse_hermes(text: str) -> ParsedTurn:
    """Hermes / Qwen format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any number."""
    turn = ParsedTurn(content=HERMES_CALL.sub("", text))
    for body in HERMES_CALL.findall(text):
        parsed = call_from_json(body, arguments_key="arguments")
        (turn.calls if isinstance(parsed, ToolCall) else turn.errors).append(parsed)
    if "<tool_call>" in turn.content:  # an opening tag left over: the call was never closed
        turn.errors.append("a <tool_call> was opened but not closed with </tool_call>")
        turn.content = turn.content.split("<tool_call>")[0]
    return turn


@register_tool_parser("llama3_json")
def parse_llama3_json(text: str) -> ParsedTurn:
    """Llama 3.x JSON calls: the turn is ``{"name": ..., "parameters": {...}}`` (optionally after
    ``<|python_tag|>``), several separated by ``;``. A turn that does not start with ``{`` is an answer."""
    body = text.replace("<|python_tag|>", "").strip()
    for end in ("<|eom_id|>", "<|eot_id|>"):
        body = body.removesuffix(end).strip()
    if not body.startswith("{"):
        return ParsedTurn(content=text)
    turn, decoder, pos = ParsedTurn(content=""), json.JSONDecoder(), 0
    while pos < len(body):
        try:
            obj, end = decoder.raw_decode(body, pos)
        except json.JSONDecodeError as err:
            turn.errors.append(f"the tool call is not valid JSON ({err.msg} at char {err.pos}): {body[pos:][:200]}")
            break
        parsed = call_from_json(json.dumps(obj), arguments_key="parameters")
        (turn.calls if isinstance(parsed, ToolCall) else turn.errors).append(parsed)
        pos = end
        while pos < len(body) and body[pos] in "; \n\t":
            pos += 1
    return turn

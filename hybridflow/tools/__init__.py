"""Tools an agent calls during a rollout (verl's ``verl.tools`` surface).

A tool answers ``create / execute / calc_reward / release`` (each call runs in a thread of its
own with a deadline, so many rollouts stay in flight while tools run and none can hang the
run); ``load_tools(path)`` builds the tools a tool-config YAML lists; ``get_tool_parser(format)`` finds the tool calls in a
generated turn (``hermes``, ``llama3_json``).
"""

from hybridflow.tools.base import BaseTool, ToolResponse, validate_tool_schema
from hybridflow.tools.config import load_tools
from hybridflow.tools.parsers import ParsedTurn, ToolCall, get_tool_parser, list_tool_parsers, register_tool_parser

__all__ = [
    "BaseTool", "ParsedTurn", "ToolCall", "ToolResponse", "get_tool_parser", "list_tool_parsers", "load_tools",
    "register_tool_parser", "validate_tool_schema",
]

"""A calculator tool: evaluates an arithmetic expression (numbers, + - * / // % **, parentheses).

The expression is parsed with ``ast`` and only arithmetic nodes are evaluated: no names,
calls or attributes, so model text can never run code. Exponents are capped so ``9**9**9``
is an error message, not a hung rollout.
"""

from __future__ import annotations

import ast
import operator
from typing import Any

from hybridflow.tools.base import BaseTool, ToolResponse

BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
          ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPONENT = 64


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression; ValueError names what is not allowed."""
    return _eval(ast.parse(expression.strip(), mode="eval").body)


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        return UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large (at most {MAX_EXPONENT})")
        return BINARY[type(node.op)](left, right)
    raise ValueError(f"only numbers and + - * / // % ** ( ) are allowed, not {ast.dump(node)[:60]}")


def format_number(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value)


class CalculatorTool(BaseTool):
    default_schema = {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression, e.g. 123 * (45 + 6).",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string",
                           "description": "The expression to evaluate"}}, "required": ["expression"]},
        },
    }

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        expression = str(parameters.get("expression", ""))
        try:
            return ToolResponse(text=format_number(evaluate(expression))), 0.0, {"ok": 1.0}
        except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as err:
            return ToolResponse(text=f"Error: cannot evaluate {expression!r}: {err}"), 0.0, {"ok": 0.0}

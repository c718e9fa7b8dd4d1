"""A Python code-interpreter tool on the local sandbox (``hybridflow.rewards.code_sandbox.run_python``:
bubblewrap namespaces, an unprivileged user, resource limits, wall-clock time-out, no network, writes
only in its own scratch dir).

The program runs in a thread so the other rollouts keep generating meanwhile. Config keys:
``timeout_s`` (default 5), ``memory_limit_mb`` (default 1024).
"""

from __future__ import annotations

import asyncio
from typing import Any

from hybridflow.rewards.code_sandbox import run_python
from hybridflow.tools.base import BaseTool, ToolResponse


class CodeInterpreterTool(BaseTool):
    default_schema = {
        "type": "function",
        "function": {
            "name": "code_interpreter",
            "description": "Run a Python program and return what it prints.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string",
                           "description": "The Python program; print the results you need"}}, "required": ["code"]},
        },
    }

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        code = str(parameters.get("code", ""))
        timeout_s = self.config.get("timeout_s", 5.0)  # null: the sandbox's DEFAULT_TIMEOUT_S
        result = await asyncio.to_thread(run_python, code, timeout_s=None if timeout_s is None else float(timeout_s),
                                         memory_mb=int(self.config.get("memory_limit_mb", 1024)))
        if result.timed_out:
            text = "Error: the program ran out of time"
        elif result.returncode != 0:
            text = f"{result.stdout}Error (exit code {result.returncode}):\n{result.stderr}".strip()
        else:
            text = result.stdout
        return ToolResponse(text=text), 0.0, {"ok": float(result.ok)}

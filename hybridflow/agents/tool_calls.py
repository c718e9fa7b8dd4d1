"""Running one trajectory's tool calls: instances, concurrency, time-outs, error turns.

A tool instance is created on the first call to that tool in a trajectory (with the row's
``extra_info.tools_kwargs[name].create_kwargs``), reused by later calls, scored with
``calc_reward`` and released when the trajectory ends. A call that cannot run (malformed,
unknown tool, too many in one turn, raised, timed out) becomes a tool message that says
why: the model gets the error back, the rollout goes on. A ``create`` that raises is a data
problem (a missing ground truth) and stops the run with its message.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hybridflow.agents.context import MultiTurnSettings
from hybridflow.tools.parsers import ParsedTurn, ToolCall


def truncate_text(text: str, *, limit: int, side: str) -> str:
    """verl's tool-response truncation: keep the start (left), the end (right) or both ends (middle)."""
    if len(text) <= limit:
        return text
    if side == "left":
        return text[:limit] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-limit:]
    half = limit // 2
    return text[:half] + "...(truncated)..." + text[-half:]


class ToolSession:
    """The tools of one trajectory; ``run_turn`` answers one assistant turn's calls."""

    def __init__(self, tools: dict[str, Any], tools_kwargs: dict[str, Any] | None, settings: MultiTurnSettings):
        self.tools = tools
        self.tools_kwargs = tools_kwargs or {}
        self.settings = settings
        self.instances: dict[str, str] = {}
        self.step_rewards: list[float] = []
        self.counts = {"tool_calls": 0, "tool_errors": 0, "tool_timeouts": 0}

    async def run_turn(self, parsed: ParsedTurn, *, agent_data: Any = None) -> list[dict[str, str]]:
        """One tool message per call and per error, calls first, in the order they were written."""
        limit = self.settings.max_parallel_calls
        run, skipped = parsed.calls[:limit], parsed.calls[limit:]
        texts = await asyncio.gather(*(self.call(c, agent_data=agent_data) for c in run))
        errors = [f"Error: {e}" for e in parsed.errors]
        errors += [f"Error: call to {c.name} skipped: at most {limit} tool calls run per turn "
                   "(multi_turn.max_parallel_calls)" for c in skipped]
        self.counts["tool_calls"] += len(run)
        self.counts["tool_errors"] += len(errors)
        side, length = self.settings.tool_response_truncate_side, self.settings.max_tool_response_length
        return [{"role": "tool", "content": truncate_text(t, limit=length, side=side)} for t in [*texts, *errors]]

    async def call(self, call: ToolCall, *, agent_data: Any = None) -> str:
        tool = self.tools.get(call.name)
        if tool is None:
            self.counts["tool_errors"] += 1
            return f"Error: there is no tool named {call.name!r}; the tools are {', '.join(sorted(self.tools))}"
        instance_id = await self.instance(call.name)
        try:
            response, step_reward, _ = await asyncio.wait_for(
                tool.execute(instance_id, call.arguments, agent_data=agent_data), timeout=self.settings.tool_timeout_s)
        except asyncio.TimeoutError:
            self.counts["tool_timeouts"] += 1
            self.counts["tool_errors"] += 1
            return f"Error: {call.name} did not answer within {self.settings.tool_timeout_s} s"
        except Exception as err:  # a tool's failure is the model's feedback, not the run's end
            self.counts["tool_errors"] += 1
            return f"Error when executing tool {call.name}: {type(err).__name__}: {err}"
        self.step_rewards.append(float(step_reward or 0.0))
        return response if isinstance(response, str) else (response.text or "")

    async def instance(self, name: str) -> str:
        if name not in self.instances:
            kwargs = self.tools_kwargs.get(name) or {}
            created = await self.tools[name].create(None, create_kwargs=kwargs.get("create_kwargs") or {})
            self.instances[name] = created[0] if isinstance(created, tuple) else created  # older verl returns the id
        return self.instances[name]

    async def close(self) -> dict[str, float]:
        """``calc_reward`` of every tool used, then release them all: {tool name: reward}."""
        rewards = {}
        for name, instance_id in self.instances.items():
            try:
                rewards[name] = float(await self.tools[name].calc_reward(instance_id))
            finally:
                await self.tools[name].release(instance_id)
        return rewards

"""Running one trajectory's tool calls: instances, concurrency, time-outs, error turns.

A tool instance is created on the first call to that tool in a trajectory (with the row's
``extra_info.tools_kwargs[name].create_kwargs``), reused by later calls, scored with
``calc_reward`` and released when the trajectory ends. A call that cannot run (malformed,
unknown tool, too many in one turn, ``create`` or ``execute`` raised, timed out, returned
something that is not ``(ToolResponse | str, number, dict)``) becomes a tool message that says
why: the model gets the error back (as verl does), it is counted in ``tool_errors``, and the
rollout goes on. Every tool method runs in its own thread with a deadline
(:mod:`hybridflow.tools.bounded`), so a blocking synchronous tool cannot hang the run.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hybridflow.agents.context import MultiTurnSettings
from hybridflow.data.vision import load_image
from hybridflow.errors import DataError
from hybridflow.tools.base import execute_result, reward_number
from hybridflow.tools.bounded import ToolCallError, ToolCallTimeout, ToolHealth, call_bounded
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


def tool_message(text: str, images: list[Any]) -> dict[str, Any]:
    """A tool turn: ``text``, or with ``images`` a content list of their image parts and then the text."""
    if not images:
        return {"role": "tool", "content": text}
    return {"role": "tool", "content": [*({"type": "image", "image": image} for image in images),
                                        *([{"type": "text", "text": text}] if text else [])]}


class ToolSession:
    """The tools of one trajectory; ``run_turn`` answers one assistant turn's calls."""

    def __init__(self, tools: dict[str, Any], tools_kwargs: dict[str, Any] | None, settings: MultiTurnSettings,
                 health: ToolHealth | None = None, *, takes_images: bool = False):
        self.tools = tools
        self.takes_images = takes_images
        """The policy reads images (a vision-language model): a tool may answer with images (decoded to RGB here;
        the agent loop turns them into tokens and pixels)."""
        self.health = health or ToolHealth()
        self.tools_kwargs = tools_kwargs or {}
        self.settings = settings
        self.instances: dict[str, str] = {}
        self.step_rewards: list[float] = []
        self.counts = {"tool_calls": 0, "tool_errors": 0, "tool_timeouts": 0}

    async def run_turn(self, parsed: ParsedTurn, *, agent_data: Any = None) -> list[dict[str, Any]]:
        """One tool message per call and per error, calls first, in the order they were written. A call that
        returned images has a content list: one ``{"type": "image", "image": PIL image}`` part per image, then its
        text (verl's layout); the others a string."""
        limit = self.settings.max_parallel_calls
        run, skipped = parsed.calls[:limit], parsed.calls[limit:]
        replies = await asyncio.gather(*(self.call(c, agent_data=agent_data) for c in run))
        errors = [(f"Error: {e}", []) for e in parsed.errors]
        errors += [(f"Error: call to {c.name} skipped: at most {limit} tool calls run per turn "
                    "(multi_turn.max_parallel_calls)", []) for c in skipped]
        self.counts["tool_calls"] += len(run)
        self.counts["tool_errors"] += len(errors)
        side, length = self.settings.tool_response_truncate_side, self.settings.max_tool_response_length
        return [tool_message(truncate_text(text, limit=length, side=side), images)
                for text, images in [*replies, *errors]]

    async def call(self, call: ToolCall, *, agent_data: Any = None) -> tuple[str, list[Any]]:
        """(text, images) of one call: the tool's reply, or an error text and no images."""
        tool = self.tools.get(call.name)
        if tool is None:
            self.counts["tool_errors"] += 1
            return f"Error: there is no tool named {call.name!r}; the tools are {', '.join(sorted(self.tools))}", []
        try:
            instance_id = await self.instance(call.name)
            result = await call_bounded(tool.execute, instance_id, call.arguments, agent_data=agent_data,
                                        timeout_s=self.settings.tool_timeout_s, what=f"tool {call.name}")
            text, images, step_reward = execute_result(call.name, result)
            images = self.decoded(call.name, images)
        except ToolCallError as err:  # a tool's failure is the model's feedback, not the run's end
            self.counts["tool_errors"] += 1
            self.counts["tool_timeouts"] += isinstance(err, ToolCallTimeout)
            self.health.record(call.name, str(err))
            return f"Error: {err}", []
        self.health.record(call.name, None)
        self.step_rewards.append(step_reward)
        return text, images

    def decoded(self, name: str, images: list[Any]) -> list[Any]:
        """``images`` as RGB PIL images; :class:`ToolCallError` for a text policy or an entry that is no image."""
        if images and not self.takes_images:
            raise ToolCallError(f"tool {name} returned {len(images)} image(s), but the policy is a text model (no "
                                "image processor): use a vision-language model, or a tool that answers in text")
        try:
            return [load_image(image, row_index=0, position=i) for i, image in enumerate(images)]
        except DataError as err:
            raise ToolCallError(f"tool {name} returned an image that cannot be read ({str(err).split(': ', 1)[-1]})"
                                ) from None

    async def instance(self, name: str) -> str:
        """The trajectory's instance of tool ``name``, created on first use (a failed create is retried)."""
        if name not in self.instances:
            kwargs = self.tools_kwargs.get(name) or {}
            created = await call_bounded(self.tools[name].create, None, create_kwargs=kwargs.get("create_kwargs") or {},
                                         timeout_s=self.settings.tool_timeout_s, what=f"tool {name} create()")
            self.instances[name] = created[0] if isinstance(created, tuple) else created  # older verl returns the id
        return self.instances[name]

    async def close(self) -> dict[str, float]:
        """``calc_reward`` of every tool used, then release them all: {tool name: reward}; a tool whose
        ``calc_reward`` fails (raises, hangs, returns no number) has no entry and counts as a tool error."""
        rewards = {}
        for name, instance_id in self.instances.items():
            tool, limit = self.tools[name], self.settings.tool_timeout_s
            try:
                reward = await call_bounded(tool.calc_reward, instance_id, timeout_s=limit,
                                            what=f"tool {name} calc_reward()")
                rewards[name] = reward_number(reward, what=f"tool {name} calc_reward()")
            except ToolCallError as err:  # said on the console: the reward changes, and nothing else shows it
                self.counts["tool_errors"] += 1
                self.health.record(f"{name} calc_reward()", str(err),
                                   consequence="its conversations get no reward from the tool")
            try:
                await call_bounded(tool.release, instance_id, timeout_s=limit, what=f"tool {name} release()")
            except ToolCallError as err:
                self.counts["tool_errors"] += 1
                self.health.record(f"{name} release()", str(err), consequence="its instances may not be freed")
        return rewards

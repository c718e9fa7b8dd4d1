"""Running a batch of rows through their agent loops on one engine.

``AgentLoopManager.run(rows, params)`` runs every row's loop (``row['agent_name']``, else
``default_agent_loop``) concurrently in one event loop; their turns share the engine through
a ``TurnGenerator``. Custom loops come from ``agent.agent_loop_config_path``: a YAML list of
``{name, _target_: module.Class, **kwargs}`` (verl's format); the class is built as
``Class(context, **kwargs)`` and needs ``async run(row, generator) -> AgentLoopOutput``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from hybridflow.agents.base import AgentLoopOutput, get_agent_loop, register_agent_loop
from hybridflow.agents.context import AgentContext, MultiTurnSettings
from hybridflow.agents.generator import CONVERSATION, TurnGenerator
from hybridflow.agents.interactions import load_interactions
from hybridflow.errors import ConfigError
from hybridflow.rollout import SamplingParams
from hybridflow.tools.config import import_class, load_tools, read_yaml
from hybridflow.tools.parsers import CALL_END_STRINGS, get_tool_parser

logger = logging.getLogger(__name__)


def load_agent_loop_config(path: str, *, key: str = "actor_rollout_ref.rollout.agent.agent_loop_config_path"
                           ) -> dict[str, dict]:
    """Register the custom loops of the YAML at ``path``; returns {name: constructor kwargs}."""
    entries = read_yaml(path, key=key)
    entries = entries if isinstance(entries, list) else entries.get("agent_loops", [])
    kwargs_by_name = {}
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or "name" not in entry or "_target_" not in entry:
            raise ConfigError(f"{path}: entry {index} needs name and _target_ (module.path.AgentLoopClass)")
        register_agent_loop(entry["name"])(import_class(entry["_target_"], where=f"{path}: entry {index}"))
        kwargs_by_name[entry["name"]] = {k: v for k, v in entry.items() if k not in ("name", "_target_")}
    return kwargs_by_name


class AgentLoopManager:
    def __init__(self, *, engine, context: AgentContext, default_agent_loop: str = "single_turn_agent",
                 loop_kwargs: dict[str, dict] | None = None):
        self.engine = engine
        self.context = context
        self.default_agent_loop = default_agent_loop
        self.loop_kwargs = loop_kwargs or {}
        self.loops: dict[str, object] = {}
        self.warned_single_turn = False
        get_agent_loop(default_agent_loop)  # a bad name fails at start-up, not at the first batch

    def run(self, rows: list[dict], params: SamplingParams) -> list[AgentLoopOutput]:
        """One output per row, in order (each row is one sample: repeat rows for n samples)."""
        return asyncio.run(self._run(rows, params))

    async def _run(self, rows: list[dict], params: SamplingParams) -> list[AgentLoopOutput]:
        call_end = CALL_END_STRINGS.get(self.context.settings.format)
        if self.context.settings.stop_after_tool_call and call_end:
            params = replace(params, stop=[*params.stop, call_end])
        settings = self.context.settings
        generator = TurnGenerator(self.engine, params, max_len=settings.prompt_length + settings.response_length,
                                  conversations=len(rows))
        try:
            outputs = list(await asyncio.gather(*(self.run_loop(index, row, generator)
                                                  for index, row in enumerate(rows))))
        finally:
            generator.close()  # a loop that raised leaves the others' turns queued: they end here, not later
        self.context.tool_health.report()  # a tool that failed on every call: one console line
        return outputs

    async def run_loop(self, index: int, row: dict, generator: TurnGenerator) -> AgentLoopOutput:
        """Row ``index``'s loop, in a task of its own that knows its conversation's index (see ``CONVERSATION``)."""
        CONVERSATION.set(index)
        return await self.loop(row).run(row, generator)

    def loop(self, row: dict):
        name = row.get("agent_name") or self.default_agent_loop
        if name == "single_turn_agent" and self.context.tools and not self.warned_single_turn:
            self.warned_single_turn = True
            logger.warning("tools are configured but rows run single_turn_agent (no tool calls): set agent_name="
                           "tool_agent in the data or actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent")
        if name not in self.loops:
            self.loops[name] = get_agent_loop(name)(self.context, **self.loop_kwargs.get(name, {}))
        return self.loops[name]


def build_agent_loop_manager(*, engine, tokenizer, rollout_cfg, template_kwargs: dict | None = None,
                             processor=None) -> AgentLoopManager:
    """The manager for ``actor_rollout_ref.rollout`` (its ``multi_turn`` and ``agent`` sections); ``processor``: a
    vision-language policy's (its conversations carry images)."""
    mt, agent = rollout_cfg.multi_turn, rollout_cfg.agent
    get_tool_parser(mt.format)
    settings = MultiTurnSettings(
        prompt_length=rollout_cfg.prompt_length, response_length=rollout_cfg.response_length,
        max_assistant_turns=mt.max_assistant_turns, max_user_turns=mt.max_user_turns,
        max_parallel_calls=mt.max_parallel_calls, max_tool_response_length=mt.max_tool_response_length,
        tool_response_truncate_side=mt.tool_response_truncate_side, tool_timeout_s=mt.tool_timeout_s,
        format=mt.format, tokenization_sanity_check_mode=mt.tokenization_sanity_check_mode,
        stop_after_tool_call=mt.stop_after_tool_call,
        template_kwargs=dict(template_kwargs or {}))
    tools = {tool.name: tool for tool in load_tools(mt.tool_config_path)} if mt.tool_config_path else {}
    interactions = load_interactions(mt.interaction_config_path) if mt.interaction_config_path else {}
    loop_kwargs = load_agent_loop_config(agent.agent_loop_config_path) if agent.agent_loop_config_path else {}
    context = AgentContext(tokenizer=tokenizer, settings=settings, tools=tools, interactions=interactions,
                           processor=processor)
    return AgentLoopManager(engine=engine, context=context, default_agent_loop=agent.default_agent_loop,
                            loop_kwargs=loop_kwargs)

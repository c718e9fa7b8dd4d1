"""Settings and shared objects every agent loop of a rollout worker reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hybridflow.tools.bounded import ToolHealth


@dataclass
class MultiTurnSettings:
    """verl's ``actor_rollout_ref.rollout.multi_turn.*`` (see hybridflow/config/ppo.py for each key)."""

    prompt_length: int
    response_length: int
    max_assistant_turns: int | None = None
    max_user_turns: int | None = None
    max_parallel_calls: int = 1
    max_tool_response_length: int = 256
    tool_response_truncate_side: str = "middle"
    tool_timeout_s: float | None = 30.0
    format: str = "hermes"
    tokenization_sanity_check_mode: str = "strict"
    stop_after_tool_call: bool = False
    template_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class AgentContext:
    """What the loops share: tokenizer, settings, tools by name, interactions by name."""

    tokenizer: Any
    settings: MultiTurnSettings
    tools: dict[str, Any] = field(default_factory=dict)
    interactions: dict[str, Any] = field(default_factory=dict)
    tool_health: ToolHealth = field(default_factory=ToolHealth)
    """Calls and failures per tool (and interaction) over the current batch; reported after each batch."""
    processor: Any = None
    """A vision-language policy's processor (its conversations carry images; tools may answer with images), or
    None for a text model."""

    @property
    def tool_schemas(self) -> list[dict]:
        return [tool.tool_schema for tool in self.tools.values()]

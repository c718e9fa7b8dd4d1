"""What every agent loop shares: its output record, the trajectory it grows, and the registry.

An agent loop is a class registered by name (a data row's ``agent_name``) with
``async run(row, generator) -> AgentLoopOutput``. ``row`` is one sample's fields
(``raw_prompt`` messages, ``raw_prompt_ids``, ``extra_info`` with ``tools_kwargs`` and
``interaction_kwargs``, ...); ``generator`` batches its turns with the other loops'.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from hybridflow.data.vision import append_images
from hybridflow.errors import ConfigError


@dataclass
class AgentLoopOutput:
    """One finished conversation, in the token layout the trainer uses.

    ``response_ids`` is everything after the prompt: generated turns and observations.
    ``response_mask[i]`` is 1 where the model generated token i (trained on), 0 on tool and
    user tokens (in the context, never in the loss). ``response_logprobs`` is 0 on masked tokens.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    finish_reason: str
    num_turns: int
    """User/tool turns + assistant turns + 1 (the prompt), as verl counts ``__num_turns__``."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Per-conversation counts: tool_calls, tool_errors, tool_timeouts, assistant_turns, user_turns, ..."""
    extra_info: dict[str, Any] = field(default_factory=dict)
    """Handed to the reward function in ``extra_info``: tool_rewards {tool: calc_reward}, tool_step_rewards,
    turn_scores (interaction scores), num_turns."""
    multi_modal_inputs: dict[str, Any] | None = None
    """A vision-language policy's images of the whole conversation, prompt's then tools', in token order:
    ``pixel_values [n_patches, C*t*p*p]``, ``image_grid_thw [n_images, 3]``; None without images."""


@dataclass
class Trajectory:
    """The growing token context of one conversation and its counters."""

    prompt_ids: list[int]
    messages: list[dict]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    counts: dict[str, float] = field(default_factory=lambda: {
        "assistant_turns": 0, "user_turns": 0, "tool_calls": 0, "tool_errors": 0, "tool_timeouts": 0,
        "interaction_errors": 0})
    finish_reason: str = "stop"
    turn_end: str = ""
    """Text of the stop token that closed the last assistant turn ('' if it was cut off)."""
    multi_modal_inputs: dict[str, Any] | None = None
    """The images of ``context_ids`` so far (see :class:`AgentLoopOutput`); every turn is generated with them."""
    row_index: int = 0
    """The row's index in its file (errors about its images name it)."""

    @property
    def context_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def add_generated(self, token_ids: list[int], logprobs: list[float] | None) -> None:
        self.response_ids += token_ids
        self.response_mask += [1] * len(token_ids)
        self.logprobs += list(logprobs) if logprobs else [0.0] * len(token_ids)
        self.counts["assistant_turns"] += 1

    def add_observation(self, token_ids: list[int], images: dict[str, Any] | None = None) -> None:
        """A tool / user turn (mask 0); ``images``: the vision inputs of its image tokens, appended after the
        conversation's earlier images."""
        self.response_ids += token_ids
        self.response_mask += [0] * len(token_ids)
        self.logprobs += [0.0] * len(token_ids)
        self.counts["user_turns"] += 1
        self.multi_modal_inputs = append_images(self.multi_modal_inputs, images)

    def output(self, *, extra_info: dict[str, Any]) -> AgentLoopOutput:
        counts = self.counts
        num_turns = int(counts["assistant_turns"] + counts["user_turns"] + 1)
        return AgentLoopOutput(prompt_ids=self.prompt_ids, response_ids=self.response_ids,
                               response_mask=self.response_mask, response_logprobs=self.logprobs,
                               finish_reason=self.finish_reason, num_turns=num_turns, metrics=dict(counts),
                               extra_info={"num_turns": num_turns, **extra_info},
                               multi_modal_inputs=self.multi_modal_inputs)


AGENT_LOOPS: dict[str, Callable[..., Any]] = {}


def register_agent_loop(name: str):
    """Decorator: make an agent-loop class (``cls(context, **kwargs)``) available as ``agent_name``."""

    def wrap(cls):
        AGENT_LOOPS[name] = cls
        return cls

    return wrap


def get_agent_loop(name: str):
    if name not in AGENT_LOOPS:
        raise ConfigError(f"agent_name {name!r} is not a registered agent loop ({', '.join(sorted(AGENT_LOOPS))}); "
                          "fix the data rows' agent_name, actor_rollout_ref.rollout.agent.default_agent_loop, or "
                          "register it in actor_rollout_ref.rollout.agent.agent_loop_config_path")
    return AGENT_LOOPS[name]

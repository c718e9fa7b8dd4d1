"""``tool_agent``: the multi-turn loop with tool calls and an optional simulated user.

    prompt (with the tool schemas) ──► generate a turn (mask 1)
        ├─ tool calls (or malformed ones) ──► run them concurrently, time-out each ──► tool turn (mask 0) ─┐
        ├─ no call, an interaction is set ──► the user's reply (mask 0), or its verdict ends it ──────────┤
        └─ no call, no interaction ──► done (the answer)                                                  │
    ◄──────────────────────────────────────────────────────────────────────────────────────────────────┘
    ends also at max_assistant_turns / max_user_turns, a turn cut off by the length budget, or an
    observation that would not fit in response_length (verl's rules). An interaction method that
    raises, hangs or answers in the wrong shape ends that conversation, counted in
    ``interaction_errors`` (the run goes on).
"""

from __future__ import annotations

import logging
from uuid import uuid4

from hybridflow.agents.base import Trajectory, register_agent_loop
from hybridflow.agents.chat import observation_ids, render_prompt, tokenization_matches
from hybridflow.agents.context import AgentContext
from hybridflow.agents.images import (collapse_image_tokens, observation_images, prompt_messages, row_index_of,
                                      with_image_tokens)
from hybridflow.agents.tool_calls import ToolSession
from hybridflow.errors import DataError
from hybridflow.tools.base import reward_number
from hybridflow.tools.bounded import ToolCallError, call_bounded
from hybridflow.tools.parsers import get_tool_parser

logger = logging.getLogger(__name__)


FAILED = object()
"""What an interaction call that failed (raised, timed out) returns: counted and said already; None is a value
a user's method may return."""


@register_agent_loop("tool_agent")
class ToolAgentLoop:
    def __init__(self, context: AgentContext, **kwargs):
        self.context = context
        self.settings = context.settings
        self.parse = get_tool_parser(self.settings.format)
        self.warned_mismatch = False

    async def run(self, row: dict, generator):
        traj = self.start(row)
        session = ToolSession(self.context.tools, extra_info_of(row).get("tools_kwargs"), self.settings,
                              health=self.context.tool_health, takes_images=self.context.processor is not None)
        user = await self.start_interaction(row, traj)
        turn_scores: list[float] = []
        try:
            while await self.assistant_turn(traj, generator) and not self.turn_limit_reached(traj):
                parsed = self.parse(traj.messages[-1]["content"])
                if parsed.calls or parsed.errors:
                    observation = await session.run_turn(parsed, agent_data=traj)
                elif user is not None:
                    observation = await self.user_reply(user, traj, turn_scores)
                else:
                    break  # an answer
                if not observation or not self.observe(traj, observation):
                    break
        finally:
            tool_rewards = await session.close()
            if user is not None:
                await self.interaction_call(traj, user, "finalize_interaction", user[1])
        for name, count in session.counts.items():  # observe() counts a tool's unreadable images too
            traj.counts[name] += count
        traj.counts["tokenization_mismatch"] = float(not self.sanity_check(traj))
        return traj.output(extra_info={"tool_rewards": tool_rewards, "tool_step_rewards": session.step_rewards,
                                       "turn_scores": turn_scores, "final_answer": self.final_answer(traj)})

    def start(self, row: dict) -> Trajectory:
        """The conversation of ``row``: its prompt with the tools described (and its images, if any)."""
        messages, images = prompt_messages(row), row.get("multi_modal_inputs")
        prompt_ids = render_prompt(self.context.tokenizer, messages, tool_schemas=self.context.tool_schemas,
                                   template_kwargs=self.settings.template_kwargs)
        prompt_ids = with_image_tokens(self.context.processor, prompt_ids, images, row_index=row_index_of(row))
        if len(prompt_ids) > self.settings.prompt_length:
            raise DataError(f"a prompt with its tool schemas is {len(prompt_ids)} tokens, longer than "
                            f"rollout.prompt_length={self.settings.prompt_length}; raise data.max_prompt_length")
        return Trajectory(prompt_ids=prompt_ids, messages=messages, multi_modal_inputs=images,
                          row_index=row_index_of(row))

    async def assistant_turn(self, traj: Trajectory, generator) -> bool:
        """Generate one turn into ``traj``; False when the conversation must end after it."""
        budget = self.settings.response_length - len(traj.response_ids)
        completion = await generator.generate(traj.context_ids, max_tokens=budget,
                                              multi_modal_inputs=traj.multi_modal_inputs)
        ids = completion.token_ids
        traj.add_generated(ids, completion.logprobs)
        traj.finish_reason = completion.finish_reason
        closed = completion.finish_reason == "stop" and bool(ids) and ids[-1] in generator.params.stop_token_ids
        text = self.context.tokenizer.decode(ids[:-1] if closed else ids, skip_special_tokens=False)
        traj.messages.append({"role": "assistant", "content": text})
        traj.turn_end = self.context.tokenizer.decode(ids[-1:], skip_special_tokens=False) if closed else ""
        return completion.finish_reason == "stop" and len(traj.response_ids) < self.settings.response_length

    def final_answer(self, traj: Trajectory) -> str:
        """The last assistant turn without its tool calls: the conversation's answer ('' when it ended on a call)."""
        last = next((m["content"] for m in reversed(traj.messages) if m["role"] == "assistant"), "")
        return self.parse(last).content.strip()

    def turn_limit_reached(self, traj: Trajectory) -> bool:
        s, counts = self.settings, traj.counts
        return bool((s.max_assistant_turns and counts["assistant_turns"] >= s.max_assistant_turns)
                    or (s.max_user_turns and counts["user_turns"] >= s.max_user_turns))

    def observe(self, traj: Trajectory, messages: list[dict]) -> bool:
        """Append tool/user messages as template tokens (mask 0), a tool's images as their image tokens (and their
        pixels to the conversation's images); False if they do not fit, or the image processor refuses an image
        (counted in tool_errors: the conversation ends there, the run goes on)."""
        ids = observation_ids(self.context.tokenizer, messages, turn_end=traj.turn_end,
                              template_kwargs=self.settings.template_kwargs)
        try:
            images = observation_images(self.context.processor, messages, row_index=traj.row_index)
        except DataError as err:
            traj.counts["tool_errors"] += 1
            self.context.tool_health.record("tool images", str(err), consequence="its conversations end there")
            return False
        ids = with_image_tokens(self.context.processor, ids, images, row_index=traj.row_index)
        if len(traj.response_ids) + len(ids) >= self.settings.response_length:
            return False
        traj.add_observation(ids, images)
        traj.messages.extend(messages)
        return True

    async def start_interaction(self, row: dict, traj: Trajectory):
        """(interaction, instance id) named by ``extra_info.interaction_kwargs.name``, or None."""
        if not self.context.interactions:
            return None
        raw = extra_info_of(row).get("interaction_kwargs") or {}
        if not isinstance(raw, dict):
            raise DataError(f"row {traj.row_index}: extra_info.interaction_kwargs is a {type(raw).__name__} "
                            f"({str(raw)[:60]!r}), expected a dict like {{'name': 'my_interaction', ...}}; store it "
                            "as a struct/dict in the data (json.loads a JSON string first)")  # fmt: skip
        kwargs = dict(raw)
        name = kwargs.get("name")
        if name not in self.context.interactions:
            raise DataError(f"row extra_info.interaction_kwargs.name={name!r} is not one of the configured "
                            f"interactions ({', '.join(self.context.interactions)}); fix the row or the interaction config")
        interaction = self.context.interactions[name]
        instance_id = await self.interaction_call(traj, (interaction, None, kwargs), "start_interaction",
                                                  uuid4().hex, **kwargs)
        return None if instance_id in (None, FAILED) else (interaction, instance_id, kwargs)

    async def user_reply(self, user, traj: Trajectory, turn_scores: list[float]) -> list[dict] | None:
        """The simulated user's next message, or None when it ends the conversation (or failed)."""
        interaction, instance_id, kwargs = user
        reply = await self.interaction_call(traj, user, "generate_response", instance_id, traj.messages, **kwargs)
        if reply is FAILED:
            return None
        try:
            done, text, score, _ = reply
            score = None if score is None else reward_number(score, what=f"interaction {interaction.name}")
            if not done and not isinstance(text, str):  # str(None) would reach the model as the user's "None"
                raise TypeError(f"the user's turn is a {type(text).__name__}, not a str")
        except (TypeError, ValueError, ToolCallError) as err:
            self.interaction_failed(traj, interaction, f"generate_response returned {str(reply)[:80]!r}: {err}; "
                                    "it must return (done: bool, text: str, score: float | None, metrics: dict), "
                                    "done=True to end the conversation")
            return None
        if score is not None:
            turn_scores.append(score)
        return None if done else [{"role": "user", "content": str(text)}]

    async def interaction_call(self, traj: Trajectory, user, method: str, *args, **kwargs):
        """``user``'s interaction ``method``, bounded like a tool call; FAILED (counted, said) when it fails."""
        interaction = user[0]
        try:
            return await call_bounded(getattr(interaction, method), *args, timeout_s=self.settings.tool_timeout_s,
                                      what=f"interaction {getattr(interaction, 'name', '?')} {method}()", **kwargs)
        except ToolCallError as err:
            self.interaction_failed(traj, interaction, str(err))
            return FAILED

    def interaction_failed(self, traj: Trajectory, interaction, message: str) -> None:
        traj.counts["interaction_errors"] += 1
        self.context.tool_health.record(f"interaction {getattr(interaction, 'name', '?')}", message,
                                        consequence="its conversations end there")

    def sanity_check(self, traj: Trajectory) -> bool:
        """``tokenization_sanity_check_mode``: the trained context must read as the template's conversation."""
        context_ids = traj.context_ids
        if traj.multi_modal_inputs:  # the template writes one pad per image
            context_ids = collapse_image_tokens(context_ids, self.context.processor.image_token_id)
        ok = tokenization_matches(self.context.tokenizer, context_ids=context_ids, messages=traj.messages,
                                  tool_schemas=self.context.tool_schemas, template_kwargs=self.settings.template_kwargs,
                                  mode=self.settings.tokenization_sanity_check_mode)
        if not ok and not self.warned_mismatch:
            self.warned_mismatch = True
            logger.warning("multi-turn context differs from the chat template's rendering of the conversation "
                           "(metric multi_turn/tokenization_mismatch); set multi_turn.tokenization_sanity_check_mode="
                           "ignore_strippable or disable if your template is known to differ")
        return ok


def extra_info_of(row: dict) -> dict:
    extra = row.get("extra_info")
    return extra if isinstance(extra, dict) else {}


"""``single_turn_agent``: one prompt, one generated response (the classic rollout as an agent loop)."""

from __future__ import annotations

from hybridflow.agents.base import Trajectory, register_agent_loop
from hybridflow.agents.context import AgentContext


@register_agent_loop("single_turn_agent")
class SingleTurnAgentLoop:
    def __init__(self, context: AgentContext, **kwargs):
        self.context = context

    async def run(self, row: dict, generator):
        traj = Trajectory(prompt_ids=list(row["raw_prompt_ids"]), messages=[])
        traj.multi_modal_inputs = row.get("multi_modal_inputs")  # the prompt's images (a vision-language policy)
        completion = await generator.generate(traj.prompt_ids, max_tokens=self.context.settings.response_length,
                                              multi_modal_inputs=traj.multi_modal_inputs)
        traj.add_generated(completion.token_ids, completion.logprobs)
        traj.finish_reason = completion.finish_reason
        return traj.output(extra_info={})

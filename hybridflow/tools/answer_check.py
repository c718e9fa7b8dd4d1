"""Answer-check tools (verl's ``Gsm8kTool`` / ``calc_gsm8k_reward`` and ``Geo3kTool`` / ``calc_geo3k_reward``):
the model submits an answer, the tool says whether it is right, and the last answer's score is the trajectory's
tool reward.

Per-sample ground truth comes from ``extra_info.tools_kwargs.<tool name>.create_kwargs.ground_truth``.
Step reward: 0 for a submission that improves the score, ``-0.05`` otherwise (verl's penalty
for resubmitting without improving).
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from hybridflow.errors import DataError
from hybridflow.rewards.geo3k import compute_score as geo3k_score
from hybridflow.rewards.gsm8k import compute_score as gsm8k_score
from hybridflow.tools.base import BaseTool, ToolResponse, create_kwargs_of

NO_IMPROVEMENT_PENALTY = -0.05


class AnswerCheckTool(BaseTool):
    default_schema = {
        "type": "function",
        "function": {
            "name": "calc_gsm8k_reward",
            "description": "Check your final answer: 1.0 if it is correct, 0.0 if it is wrong or not a number.",
            "parameters": {"type": "object", "properties": {"answer": {"type": "string",
                           "description": "The final answer, digits only"}}, "required": ["answer"]},
        },
    }

    def __init__(self, config: dict | None = None, tool_schema: dict | None = None):
        super().__init__(config, tool_schema)
        self.instances: dict[str, dict[str, Any]] = {}

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        instance_id = instance_id or uuid4().hex
        ground_truth = create_kwargs_of(kwargs).get("ground_truth")
        if ground_truth is None:
            raise DataError(f"tool {self.name} needs a ground truth: add extra_info.tools_kwargs.{self.name}."
                            "create_kwargs.ground_truth to the data row")
        self.instances[instance_id] = {"answer": "", "ground_truth": str(ground_truth), "reward": 0.0}
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        answer = str(parameters.get("answer", ""))
        state = self.instances[instance_id]
        state["answer"] = self.submission(answer)
        reward = await self.calc_reward(instance_id)
        step_reward = 0.0 if reward > state["reward"] else NO_IMPROVEMENT_PENALTY
        state["reward"] = max(state["reward"], reward)
        return ToolResponse(text=f"Current parsed answer={answer!r} reward={reward}"), step_reward, {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        state = self.instances[instance_id]
        return self.score(state["answer"], state["ground_truth"])

    def submission(self, answer: str) -> str:
        """The text the scorer reads for a submitted ``answer`` (GSM8K's: after ``#### ``)."""
        return answer if answer.startswith("#### ") else "#### " + answer

    def score(self, submission: str, ground_truth: str) -> float:
        return gsm8k_score(submission, ground_truth, method="flexible")

    async def release(self, instance_id: str, **kwargs) -> None:
        self.instances.pop(instance_id, None)


class Geo3kAnswerCheckTool(AnswerCheckTool):
    """verl's ``Geo3kTool``: the submitted answer itself (no ``\\boxed{}``) against the Geometry3K answer, with the
    geo3k scorer (``hybridflow.rewards.geo3k``) and no format score, as verl's tool scores it."""

    default_schema = {
        "type": "function",
        "function": {
            "name": "calc_geo3k_reward",
            "description": "Check your final answer to the geometry problem: 1.0 if it is correct, 0.0 otherwise.",
            "parameters": {"type": "object", "properties": {"answer": {"type": "string",
                           "description": "The final answer to the geometry problem"}}, "required": ["answer"]},
        },
    }

    def submission(self, answer: str) -> str:
        return answer

    def score(self, submission: str, ground_truth: str) -> float:
        return geo3k_score(submission, ground_truth, use_boxed=False, format_score=0.0)

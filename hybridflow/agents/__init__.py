"""Agent loops: multi-turn rollouts with tool calls and simulated users over one engine.

Importing the package registers the built-in loops: ``single_turn_agent`` and ``tool_agent``.
"""

from hybridflow.agents import single_turn, tool_agent  # noqa: F401  (registration)
from hybridflow.agents.base import AGENT_LOOPS, AgentLoopOutput, Trajectory, get_agent_loop, register_agent_loop
from hybridflow.agents.context import AgentContext, MultiTurnSettings
from hybridflow.agents.generator import TurnGenerator
from hybridflow.agents.interactions import AnswerFeedbackInteraction, BaseInteraction, load_interactions
from hybridflow.agents.manager import AgentLoopManager, load_agent_loop_config

__all__ = [
    "AGENT_LOOPS", "AgentContext", "AgentLoopManager", "AgentLoopOutput", "AnswerFeedbackInteraction",
    "BaseInteraction", "MultiTurnSettings", "Trajectory", "TurnGenerator", "get_agent_loop", "load_agent_loop_config",
    "load_interactions", "register_agent_loop",
]

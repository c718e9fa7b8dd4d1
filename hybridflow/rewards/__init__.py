"""Rewards: scorers, reward managers, custom functions, reward models, code sandbox.

Names are imported lazily (PEP 562) so that ``import hybridflow.rewards`` stays cheap:
a reward worker process must not pay for torch, math-verify or reasoning-gym before
it needs them.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "RewardResult": "result",
    "normalize_score": "result",
    "register_scorer": "registry",
    "get_scorer": "registry",
    "default_compute_score": "registry",
    "registered_data_sources": "registry",
    "load_reward_function": "custom",
    "RewardFunction": "custom",
    "build_reward_manager": "manager",
    "register_reward_manager": "manager",
    "list_reward_managers": "manager",
    "RewardManager": "manager",
    "DapoRewardManager": "manager",
    "ScoringPool": "worker_pool",
    "place_scores_on_last_token": "placement",
    "RewardModelScorer": "reward_model",
    "GenerativeJudge": "generative_judge",
    "run_python": "code_sandbox",
    "run_asserts": "code_sandbox",
    "ExecutionResult": "code_sandbox",
    "SandboxUnavailableError": "code_sandbox",
    "sandbox_available": "code_sandbox",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hybridflow.rewards' has no attribute {name!r}")
    return getattr(importlib.import_module(f"hybridflow.rewards.{_EXPORTS[name]}"), name)

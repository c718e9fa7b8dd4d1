"""Interactions: simulated users that answer the model's turns (verl's ``verl.interactions``).

API (all coroutines)::

    instance_id = await interaction.start_interaction(instance_id, **interaction_kwargs)
    done, text, score, metrics = await interaction.generate_response(instance_id, messages, **interaction_kwargs)
    score = await interaction.calculate_score(instance_id)
    await interaction.finalize_interaction(instance_id)

``interaction_kwargs`` come from the row's ``extra_info.interaction_kwargs``; its ``name`` picks
the interaction. The config YAML (``multi_turn.interaction_config_path``)::

    interaction:
      - name: gsm8k
        class_name: hybridflow.agents.interactions.AnswerFeedbackInteraction
        config: {}
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from hybridflow.errors import ConfigError
from hybridflow.rewards.gsm8k import compute_score
from hybridflow.tools.config import import_class, instantiate, read_yaml

VERL_CLASS_PATHS = {
    "verl.interactions.gsm8k_interaction.Gsm8kInteraction": "hybridflow.agents.interactions.AnswerFeedbackInteraction",
}

INTERACTION_METHODS = ("start_interaction", "generate_response", "finalize_interaction")


class BaseInteraction:
    """A user that says nothing and ends the conversation; subclasses override ``generate_response``."""

    def __init__(self, config: dict[str, Any]):
        self.config = dict(config)
        self.name = self.config.get("name", "interaction_agent")

    async def start_interaction(self, instance_id: str | None = None, **kwargs) -> str:
        return instance_id or uuid4().hex

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]], **kwargs
                                ) -> tuple[bool, str, float, dict[str, Any]]:
        return True, "", 0.0, {}

    async def calculate_score(self, instance_id: str, **kwargs) -> float:
        return 0.0

    async def finalize_interaction(self, instance_id: str, **kwargs) -> None:
        return None


class AnswerFeedbackInteraction(BaseInteraction):
    """verl's GSM8K interaction: checks the last assistant message against ``ground_truth``
    (GSM8K ``#### N``, flexible); right ends the conversation with score 1, wrong asks to try again."""

    def __init__(self, config: dict[str, Any]):
        super().__init__(config)
        self.instances: dict[str, dict[str, Any]] = {}

    async def start_interaction(self, instance_id: str | None = None, ground_truth: str | None = None, **kwargs) -> str:
        instance_id = instance_id or uuid4().hex
        self.instances[instance_id] = {"ground_truth": str(ground_truth), "response": ""}
        return instance_id

    async def generate_response(self, instance_id, messages, **kwargs):
        answers = [m["content"] for m in messages if m["role"] == "assistant"]
        self.instances[instance_id]["response"] = answers[-1] if answers else ""
        score = await self.calculate_score(instance_id)
        if score == 1.0:
            return True, "Your response is correct!", score, {}
        return False, "Your response is incorrect! You need to reflect on your answer and try again.", score, {}

    async def calculate_score(self, instance_id: str, **kwargs) -> float:
        state = self.instances[instance_id]
        return compute_score(state["response"], state["ground_truth"], method="flexible")

    async def finalize_interaction(self, instance_id: str, **kwargs) -> None:
        self.instances.pop(instance_id, None)


def load_interactions(path: str, *, key: str = "actor_rollout_ref.rollout.multi_turn.interaction_config_path"
                      ) -> dict[str, BaseInteraction]:
    """{name: interaction} from the YAML at ``path`` (entries under ``interaction:``)."""
    loaded = read_yaml(path, key=key)
    entries = loaded.get("interaction") if isinstance(loaded, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{key}: {path} must hold a non-empty list under 'interaction:' (each with class_name)")
    interactions: dict[str, BaseInteraction] = {}
    for index, entry in enumerate(entries):
        where = f"{path}: interaction[{index}]"
        if not isinstance(entry, dict) or "class_name" not in entry:
            raise ConfigError(f"{where} needs a class_name (e.g. hybridflow.agents.interactions.AnswerFeedbackInteraction)")
        cls = import_class(VERL_CLASS_PATHS.get(entry["class_name"], entry["class_name"]), where=where)
        name = entry.get("name") or cls.__name__
        if name in interactions:
            raise ConfigError(f"{where}: a second interaction is named {name!r}; names must be unique")
        interactions[name] = instantiate(cls, where=where, methods=INTERACTION_METHODS,
                                         config={**(entry.get("config") or {}), "name": name})
    return interactions

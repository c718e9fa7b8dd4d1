"""Helpers every ``python -m`` entry point shares (PPO, SFT, self-play): device, seeds, context length, the engine
and tracker names every RL run checks before any model loads."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from hybridflow.config.validate import as_list
from hybridflow.errors import ConfigError
from hybridflow.models.loader import check_routing
from hybridflow.rollout.engine import engine_unavailable
from hybridflow.trainer.tracking.trackers import available_backends


def resolve_device(name: str) -> torch.device:
    """``trainer.device`` (``cpu`` / ``cuda`` / ``auto``); on GPU each torchrun process takes ``cuda:LOCAL_RANK``."""
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"trainer.device={name} but no CUDA device is available: use trainer.device=cpu or auto")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def seed_everything(seed: int) -> None:
    """Python, numpy and torch generators from ``trainer.seed``."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def model_context_length(path: str, trust_remote_code: bool, override_config: dict | None = None) -> int | None:
    """``max_position_embeddings`` from the model's config (no weights loaded); None if unreadable. A mixture of
    experts whose routing cannot run is a ModelError here already.

    ``model.override_config`` wins, as it does when the model loads (verl's long-context scripts raise it that way).
    """
    from transformers import AutoConfig

    if (override_config or {}).get("max_position_embeddings"):
        return int(override_config["max_position_embeddings"])
    try:
        config = AutoConfig.from_pretrained(os.path.expanduser(str(path)), trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return None  # validation reports a bad path; the loader reports an unreadable model with its own message
    check_routing(config, path)  # a MoE config that cannot route: said before the data and the weights load
    return getattr(config.get_text_config(), "max_position_embeddings", None)  # a VLM's is its language model's


def engine_and_logger_problems(cfg) -> list[str]:
    """Registered names every trainer that generates reads: the rollout engine and the trackers."""
    engine_problem = engine_unavailable(cfg.actor_rollout_ref.rollout.name)
    problems = [f"actor_rollout_ref.{engine_problem}"] if engine_problem else []
    for name in as_list(cfg.trainer.logger):
        if name not in available_backends():
            problems.append(f"trainer.logger: unknown backend {name!r}; choose from {', '.join(available_backends())}")
    return problems


"""Helpers every ``python -m`` entry point shares (PPO, SFT, self-play): device, seeds, context length, the engine
and tracker names every RL run checks before any model loads."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from hybridflow.config.validate import as_list
from hybridflow.errors import ConfigError
from hybridflow.models.hub import ensure_hub_reachable
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


def read_model_config(path: str, trust_remote_code: bool):
    """The model's ``config.json`` as a transformers config (no weights loaded); None if unreadable (validation
    reports a bad path; the loader reports an unreadable model with its own message)."""
    from transformers import AutoConfig

    ensure_hub_reachable(str(path))  # no hub: one line now, not transformers' retries
    try:
        return AutoConfig.from_pretrained(os.path.expanduser(str(path)), trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return None


def model_context_length(path: str, trust_remote_code: bool, override_config: dict | None = None) -> int | None:
    """``max_position_embeddings`` from the model's config (no weights loaded); None if unreadable. A mixture of
    experts whose routing cannot run is a ModelError here already.

    ``model.override_config`` wins, as it does when the model loads (verl's long-context scripts raise it that way).
    """
    if (override_config or {}).get("max_position_embeddings"):
        return int(override_config["max_position_embeddings"])
    config = read_model_config(path, trust_remote_code)
    if config is None:
        return None
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



def check_user_data_classes(data) -> None:
    """verl's user dataset class (``data.custom_cls``) and sampler class (``data.sampler``, its curriculum
    learning), refused before anything loads, one line each."""
    problems = []
    if data.custom_cls.path or data.custom_cls.name:
        problems.append(f"data.custom_cls (path={data.custom_cls.path!r}, name={data.custom_cls.name!r}): a user "
                        "dataset class is not supported; write the rows in verl's parquet schema (prompt, data_source, "
                        "reward_model, extra_info) and drop data.custom_cls.*")
    if data.sampler.class_path or data.sampler.class_name:
        problems.append(f"data.sampler (class_path={data.sampler.class_path!r}, class_name="
                        f"{data.sampler.class_name!r}): a user sampler (curriculum) is not supported; drop "
                        "data.sampler.* (the training set is shuffled by data.shuffle and data.seed)")
    if problems:
        raise ConfigError("\n".join(problems))

"""Helpers every ``python -m`` entry point shares (PPO, SFT, self-play): device, seeds, context length, the engine
and tracker names every RL run checks before any model loads."""

from __future__ import annotations

import logging
import os
import random
from typing import Any

import numpy as np
import torch

from hybridflow.config.validate import as_list, split_placement
from hybridflow import omp
from hybridflow.cpu import keep_freed_heap
from hybridflow.errors import ConfigError
from hybridflow.models.hub import ensure_hub_reachable
from hybridflow.models.loader import check_routing
from hybridflow.rollout.engine import (engine_capabilities, engine_config_problems, engine_model_problem,
                                       engine_unavailable)
from hybridflow.trainer.tracking.trackers import available_backends

logger = logging.getLogger(__name__)


def runs_on_cpu(name: str) -> bool:
    """Whether ``trainer.device`` (``cpu`` / ``cuda`` / ``auto``) means the CPU here."""
    return name == "cpu" or (name == "auto" and not torch.cuda.is_available())


def resolve_device(name: str) -> torch.device:
    """``trainer.device`` (``cpu`` / ``cuda`` / ``auto``); on GPU each torchrun process takes ``cuda:LOCAL_RANK``."""
    if runs_on_cpu(name):
        keep_freed_heap()  # a CPU step reuses the pages the step before it freed (hybridflow/cpu.py)
        omp.say()  # how OpenMP's workers wait, chosen at import (hybridflow/omp.py)
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


def check_rollout_model(cfg) -> None:
    """The rollout backend can serve the policy's model here (read from its config.json, no weights loaded)."""
    model = cfg.actor_rollout_ref.model
    config = read_model_config(model.path, model.trust_remote_code)
    problem = config is not None and engine_model_problem(cfg.actor_rollout_ref.rollout.name, config)
    if problem:
        raise ConfigError(f"actor_rollout_ref.{problem}")


def engine_and_logger_problems(cfg) -> list[str]:
    """Registered names every trainer that generates reads: the rollout engine and the trackers."""
    engine_problem = engine_unavailable(cfg.actor_rollout_ref.rollout.name)
    problems = [f"actor_rollout_ref.{engine_problem}"] if engine_problem else []
    problems += engine_config_problems(cfg.actor_rollout_ref.rollout)
    for name in as_list(cfg.trainer.logger):
        if name not in available_backends():
            problems.append(f"trainer.logger: unknown backend {name!r}; choose from {', '.join(available_backends())}")
    return problems



def partial_rollout_blocker(cfg: Any) -> str | None:
    """Why ``async_training.partial_rollout`` cannot act in this run, or None where it can (an engine that pauses,
    single-turn, in this process or in a rollout pool of its own)."""
    rollout = cfg.actor_rollout_ref.rollout
    if not engine_capabilities(rollout.name).pauses or rollout.multi_turn.enable:
        return f"the {rollout.name} engine{' in multi-turn' if rollout.multi_turn.enable else ''} cannot pause"
    if cfg.trainer.backend != "local" and not split_placement(cfg):
        return "on Ray only a rollout pool of its own (rollout.n_gpus_per_node > 0) takes a sync mid-generate"
    return None


def partial_rollout_problems(cfg: Any) -> list[str]:
    """``partial_rollout=True`` where it cannot act is refused before anything loads, except with a server engine
    (vLLM / SGLang): verl's fully async recipes turn it on with them (its YAML's default), so there it is off with a
    warning."""
    blocker = partial_rollout_blocker(cfg) if cfg.async_training.partial_rollout else None
    if blocker is None or engine_capabilities(cfg.actor_rollout_ref.rollout.name).server:
        return []
    return [f"async_training.partial_rollout=True cannot act here ({blocker}): use rollout.name=native or vllm "
            "single-turn (on Ray with rollout.n_gpus_per_node > 0), or set async_training.partial_rollout=False"]


def partial_rollouts(cfg: Any) -> bool:
    """``async_training.partial_rollout`` where it can act: the native and vLLM engines pause single-turn sequences at
    a weight sync. With a server engine that cannot (SGLang; vLLM in multi-turn) it warns once and in-flight sequences finish with the weights they started
    with; elsewhere :func:`partial_rollout_problems` refused it before loading."""
    if not cfg.async_training.partial_rollout:
        return False
    reason = partial_rollout_blocker(cfg)
    if reason is None:
        return True
    if reason not in _PARTIAL_WARNED:
        _PARTIAL_WARNED.add(reason)
        logger.warning("hybridflow: warning: async_training.partial_rollout=True has no effect here (%s): sequences in "
                       "flight at a weight sync finish with the weights they started with (the native or vLLM "
                       "engine, single-turn, needed)", reason)
    return False


_PARTIAL_WARNED: set[str] = set()


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

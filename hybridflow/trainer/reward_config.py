"""From ``reward_model.*`` to the reward manager's arguments, as verl routes them.

In verl, ``reward_model.reward_kwargs`` are keyword arguments of the reward *manager*
(DAPO scripts pass ``overlong_buffer_cfg`` and ``max_resp_len`` there), while
``custom_reward_function.reward_kwargs`` are bound to the scoring function. A manager
that is not registered, or a ``reward_kwargs`` entry the chosen manager does not take,
is a config error found before any model loads.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from hybridflow.rewards import list_reward_managers

VERL_MANAGER_KWARGS: dict[str, tuple[str, ...]] = {"dapo": ("overlong_buffer_cfg", "max_resp_len")}
"""``reward_model.reward_kwargs`` entries each manager takes (verl's constructor arguments)."""


def _as_dict(value: Any) -> dict:
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    return dict(value or {})


def _dapo(cfg) -> dict[str, Any]:
    """verl's ``overlong_buffer_cfg`` / ``max_resp_len`` win over ``overlong_buffer`` / data.max_response_length."""
    rm, buffer = cfg.reward_model, cfg.reward_model.overlong_buffer
    verl_buffer = _as_dict(rm.reward_kwargs.get("overlong_buffer_cfg"))
    return {"max_response_length": rm.reward_kwargs.get("max_resp_len") or cfg.data.max_response_length,
            "overlong_buffer_len": verl_buffer.get("len", buffer.len),
            "penalty_factor": verl_buffer.get("penalty_factor", buffer.penalty_factor),
            "enable_overlong_buffer": verl_buffer.get("enable", buffer.enable)}


def _pool(cfg) -> dict[str, Any]:
    return {"num_workers": cfg.reward_model.num_workers}


MANAGER_SPECIFIC: dict[str, Callable[[Any], dict[str, Any]]] = {"parallel": _pool, "prime": _pool, "dapo": _dapo}
"""Keyword arguments only some reward managers take, by ``reward_model.reward_manager``."""


def reward_manager_kwargs(cfg) -> dict[str, Any]:
    """The arguments of ``build_reward_manager(cfg.reward_model.reward_manager, ...)`` besides the scorer."""
    rm = cfg.reward_model
    kwargs = {"reward_kwargs": dict(cfg.custom_reward_function.reward_kwargs) or None,
              "failure_score": rm.failure_score, "timeout_s": rm.timeout_s}
    kwargs.update(MANAGER_SPECIFIC.get(rm.reward_manager, lambda _: {})(cfg))
    return kwargs


def reward_manager_problems(cfg) -> list[str]:
    """An unregistered manager name, and ``reward_kwargs`` the manager does not take."""
    name = cfg.reward_model.reward_manager
    if name not in list_reward_managers():
        return [f"reward_model.reward_manager={name!r} is not one of {', '.join(list_reward_managers())}"]
    accepted = VERL_MANAGER_KWARGS.get(name, ())
    problems = [f"reward_model.reward_kwargs.{key} is not an argument of the {name!r} reward manager"
                f" (it takes: {', '.join(accepted) or 'none'}); keyword arguments of the scoring function go in"
                f" custom_reward_function.reward_kwargs.{key}"
                for key in cfg.reward_model.reward_kwargs if key not in accepted]
    if name == "dapo" and not problems:
        dapo = _dapo(cfg)
        if dapo["enable_overlong_buffer"] and not 0 < dapo["overlong_buffer_len"] <= dapo["max_response_length"]:
            problems.append(f"the dapo overlong buffer length {dapo['overlong_buffer_len']} must be in (0, "
                            f"max_resp_len={dapo['max_response_length']}]: set reward_model.overlong_buffer.len "
                            "(or reward_kwargs.overlong_buffer_cfg.len)")
    return problems

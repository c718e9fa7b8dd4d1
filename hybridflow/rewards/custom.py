"""Loading a user's reward function from a ``.py`` file (verl's ``custom_reward_function``).

``custom_reward_function.path`` names a Python file and ``.name`` (default
``compute_score``) a function in it with verl's signature
``(data_source, solution_str, ground_truth, extra_info=None, **kwargs)``.
``reward_kwargs`` are bound as extra keyword arguments.

The result is a :class:`RewardFunction`, which pickles as *(path, name, kwargs)*
and re-loads the file on the other side: a function loaded from a file path has no
importable module name, so this is what lets it run in reward-manager worker
processes.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
from typing import Any, Callable

from hybridflow.errors import ConfigError

REQUIRED_PARAMETERS = ("data_source", "solution_str", "ground_truth", "extra_info")


def _import_file(path: str):
    module_name = f"hybridflow_custom_reward_{abs(hash(path)):x}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"custom_reward_function.path {path!r} is not a Python file; point it at a .py file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as error:
        line = (error.text or "").strip()
        raise ConfigError(
            f"syntax error in custom reward file {path}, line {error.lineno}: {line!r} ({error.msg}); fix the file"
        ) from None
    except Exception as error:
        reason = f"{type(error).__name__}: {error}"
        raise ConfigError(f"importing custom reward file {path} failed: {reason}; fix the file") from error
    sys.modules[module_name] = module
    return module


def _check_signature(fn: Callable, *, path: str, name: str) -> None:
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return  # builtins / C callables: cannot inspect, trust the user
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    by_keyword = {n for n, p in parameters.items() if p.kind is not inspect.Parameter.POSITIONAL_ONLY}
    missing = [p for p in REQUIRED_PARAMETERS if p not in by_keyword and not takes_kwargs]
    if missing:
        raise ConfigError(
            f"custom reward function {name!r} in {path} must accept {', '.join(REQUIRED_PARAMETERS)}; "
            f"it lacks {', '.join(missing)}: define it as "
            f"def {name}(data_source, solution_str, ground_truth, extra_info=None, **kwargs)"
        )


def _resolve(path: str, name: str) -> Callable:
    if not os.path.isfile(path):
        raise ConfigError(f"custom_reward_function.path {path!r} does not exist; give the path of a .py file")
    module = _import_file(path)
    fn = getattr(module, name, None)
    if not callable(fn):
        public = {k: v for k, v in vars(module).items() if not k.startswith("_") and not inspect.ismodule(v)}
        callables = sorted(k for k, v in public.items() if callable(v))
        raise ConfigError(
            f"no function {name!r} in {path}; set custom_reward_function.name to one of: "
            f"{', '.join(callables) or '(none)'}"
        )
    _check_signature(fn, path=path, name=name)
    return fn


class RewardFunction:
    """A user's reward function with its ``reward_kwargs`` bound; picklable by path."""

    def __init__(self, path: str, name: str = "compute_score", reward_kwargs: dict | None = None):
        self.path = os.path.abspath(os.path.expanduser(path))
        self.name = name
        self.reward_kwargs = dict(reward_kwargs or {})
        self._fn = _resolve(self.path, name)

    def __call__(self, data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **kw):
        # by keyword, as verl calls it, so that ``def compute_score(**kwargs)`` works too
        row = dict(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth, extra_info=extra_info)
        return self._fn(**row, **self.reward_kwargs, **kw)

    def __reduce__(self):
        return (RewardFunction, (self.path, self.name, self.reward_kwargs))

    def __repr__(self) -> str:
        return f"RewardFunction({self.path!r}, name={self.name!r})"


def load_reward_function(path: str, name: str = "compute_score", reward_kwargs: dict | None = None) -> RewardFunction:
    """Load ``name`` from the file at ``path`` (see module docstring).

    Raises:
        ConfigError: the file is missing, does not compile (the message shows the
            line), has no callable ``name`` (the message lists its callables), or the
            function does not accept data_source, solution_str, ground_truth, extra_info.
    """
    return RewardFunction(path, name, reward_kwargs)

"""Routing a row's ``data_source`` to its scorer.

A scorer registered here takes verl's reward-function signature
``(data_source, solution_str, ground_truth, extra_info=None) -> float | dict``.
Built-in scorers register themselves when their module is imported; every
reasoning-gym task name (the package's own dataset registry) routes to the
reasoning-gym scorer without being listed one by one.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from hybridflow.errors import ConfigError, DataError

Scorer = Callable[..., Any]

_SCORERS: dict[str, Scorer] = {}


@dataclass(frozen=True)
class ScorerNeeds:
    """What a scorer needs before a run starts: the row's ground truth, and a ``preflight`` check."""

    ground_truth: bool = True
    preflight: Callable[[], None] | None = None
    keyword_args: tuple[str, ...] = ()
    """The ``custom_reward_function.reward_kwargs`` it takes; any other key is an error, not ignored."""


_NEEDS: dict[Scorer, ScorerNeeds] = {}
_BUILTIN_MODULES = ("gsm8k", "math", "code", "synthetic", "geo3k", "shape_count")
_builtins_loaded = False


def register_scorer(
    *data_sources: str,
    needs_ground_truth: bool = True,
    preflight: Callable[[], None] | None = None,
    keyword_args: tuple[str, ...] = (),
) -> Callable[[Scorer], Scorer]:
    """Decorator: route each of ``data_sources`` to the decorated scorer.

    ``needs_ground_truth``: rows must carry ``reward_model.ground_truth`` (checked when the
    data loads). ``preflight``: called once at load time when a row uses this scorer; it
    raises a :class:`~hybridflow.errors.HybridflowError` when the scorer cannot work here.
    ``keyword_args``: the keyword arguments (``custom_reward_function.reward_kwargs``) it takes.

    Example::

        @register_scorer("my_org/my_task")
        def score_my_task(data_source, solution_str, ground_truth, extra_info=None):
            return float(solution_str.strip() == ground_truth)
    """
    if not data_sources:
        raise ValueError("register_scorer needs at least one data_source name")

    def decorate(fn: Scorer) -> Scorer:
        for source in data_sources:
            existing = _SCORERS.get(source)
            if existing is not None and existing is not fn:
                raise ValueError(f"data_source {source!r} already routed to {existing.__module__}.{existing.__name__}")
            _SCORERS[source] = fn
        _NEEDS[fn] = ScorerNeeds(ground_truth=needs_ground_truth, preflight=preflight, keyword_args=keyword_args)
        return fn

    return decorate


def _load_builtin_scorers() -> None:
    # Imported on first use, not at package import: the scorer modules pull in
    # math-verify and friends, which a process that only places scores never needs.
    global _builtins_loaded
    if not _builtins_loaded:
        for name in _BUILTIN_MODULES:
            importlib.import_module(f"hybridflow.rewards.{name}")
        _builtins_loaded = True


def registered_data_sources() -> list[str]:
    """Data sources with an explicitly registered scorer (reasoning-gym tasks excluded)."""
    _load_builtin_scorers()
    return sorted(_SCORERS)


def get_scorer(data_source: str) -> Scorer:
    """The scorer for ``data_source``.

    Raises:
        DataError: no scorer knows this data source.
    """
    _load_builtin_scorers()
    if data_source in _SCORERS:
        return _SCORERS[data_source]
    from hybridflow.rewards import reasoning_gym as rg_scorer

    if rg_scorer.is_reasoning_gym_task(data_source):
        return rg_scorer.score_row
    known = ", ".join(registered_data_sources())
    close = difflib.get_close_matches(str(data_source), registered_data_sources(), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise DataError(
        f"no reward scorer for data_source {data_source!r}{hint}; known sources: {known}, and any reasoning-gym "
        "task name. Set custom_reward_function.path (and .name) to a .py file whose function scores this source."
    )


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **kwargs
):
    """verl's ``default_compute_score``: score one response with its data source's scorer.

    Extra keyword arguments (``custom_reward_function.reward_kwargs``) are passed to the scorer;
    one it does not take is a :class:`ConfigError`, never silently dropped.
    """
    scorer = get_scorer(data_source)
    check_keyword_args(scorer, data_source, kwargs)
    return scorer(data_source, solution_str, ground_truth, extra_info, **kwargs)


def check_keyword_args(scorer: Scorer, data_source: str, kwargs: dict) -> None:
    """ConfigError naming the first of ``kwargs`` that the scorer of ``data_source`` does not take."""
    accepted = _NEEDS.get(scorer, ScorerNeeds()).keyword_args
    unknown = [key for key in kwargs if key not in accepted]
    if unknown:
        raise ConfigError(
            f"custom_reward_function.reward_kwargs.{unknown[0]} is not an argument of the built-in scorer of "
            f"data_source {data_source!r} (it takes: {', '.join(accepted) or 'none'}); remove it, or score with "
            "your own custom_reward_function.path"
        )


def check_rows_scorable(rows: Iterable[tuple[int, Any, Any]], *, files: str, reward_kwargs: dict | None = None) -> None:
    """Check at load time that the built-in scorers can score every row.

    ``rows`` holds ``(row_index, data_source, ground_truth)``. Each data source must have
    a scorer, each row the fields its scorer needs, each scorer's preflight must pass, and
    each scorer must take every key of ``reward_kwargs``.

    Raises:
        DataError: the first unknown data source or row without a needed ground truth,
            naming the row, the file key and the fix.
    """
    checked: set = set()
    for row_index, data_source, ground_truth in rows:
        try:
            scorer = get_scorer(data_source)
        except DataError as error:
            raise DataError(f"{files}, row {row_index}: {error}") from None
        needs = _NEEDS.get(scorer, ScorerNeeds())
        if needs.ground_truth and ground_truth is None:
            raise DataError(
                f"{files}, row {row_index} (data_source {data_source!r}): reward_model.ground_truth is missing and "
                "its scorer needs it; add {'reward_model': {'style': 'rule', 'ground_truth': ...}} to every row, "
                "or score with custom_reward_function.path"
            )
        if scorer not in checked:
            check_keyword_args(scorer, data_source, reward_kwargs or {})
            if needs.preflight is not None:
                needs.preflight()
        checked.add(scorer)

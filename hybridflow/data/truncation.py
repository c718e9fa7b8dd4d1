"""Fitting a token sequence into a length limit: verl's ``data.truncation`` modes.

``error`` refuses, ``left`` keeps the last ``max_length`` tokens (the end of a prompt
is what the model answers), ``right`` keeps the first ``max_length``, ``middle``
keeps the first ``max_length // 2`` and the last ``max_length - max_length // 2``
(both the instructions at the start and the question at the end survive).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from hybridflow.errors import DataError

T = TypeVar("T")
Truncator = Callable[[Sequence[T], int], list[T]]
TRUNCATIONS: dict[str, Truncator] = {}


def register_truncation(name: str) -> Callable[[Truncator], Truncator]:
    def decorate(fn: Truncator) -> Truncator:
        TRUNCATIONS[name] = fn
        return fn

    return decorate


@register_truncation("left")
def keep_last(seq: Sequence[T], max_length: int) -> list[T]:
    return list(seq[len(seq) - max_length :])


@register_truncation("right")
def keep_first(seq: Sequence[T], max_length: int) -> list[T]:
    return list(seq[:max_length])


@register_truncation("middle")
def keep_both_ends(seq: Sequence[T], max_length: int) -> list[T]:
    head = max_length // 2
    tail = max_length - head
    return list(seq[:head]) + list(seq[len(seq) - tail :])


def check_truncation(mode: str, *, allowed: Sequence[str], config_key: str) -> None:
    """Reject an unknown mode up front (before any row is read)."""
    if mode not in allowed:
        raise DataError(f"unknown {config_key}={mode!r}; choose one of {list(allowed)}")


def truncate(
    seq: Sequence[T], *, max_length: int, mode: str, row_index: int, what: str, limit_key: str, fix: str
) -> list[T]:
    """``seq`` itself if it fits, else cut by ``mode``; 'error' raises naming row, length, limit and ``fix``."""
    if len(seq) <= max_length:
        return list(seq)
    if mode == "error":
        raise DataError(f"row {row_index}: {what} has {len(seq)} tokens, more than {limit_key}={max_length}; {fix}")
    return TRUNCATIONS[mode](seq, max_length)

"""How a call on a worker group becomes calls on its ranks, and how the answers come back.

Each worker method declares a *dispatch mode* (how arguments are split over the N
ranks) and a *collector* (how the N results are merged), either with the ``@dispatch``
decorator on the method or in a table registered for a worker class whose file the
controller does not own. The worker group reads the declaration; nothing else in the
loop knows that there are N ranks.

=============  ===============================================  =================
mode           arguments                                        default collector
=============  ===============================================  =================
DP_COMPUTE     every ``Batch`` argument cut into N equal        ``concat``
               chunks, rank r gets chunk r; others broadcast
ONE_TO_ALL     the same arguments to every rank                 ``list``
RANK_ZERO      only rank 0 runs                                 ``first``
ALL_TO_ALL     each argument is a list of N values, one a rank  ``list``
=============  ===============================================  =================
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hybridflow.data.batch import Batch
from hybridflow.errors import ConfigError

DISPATCH_ATTR = "__hybridflow_dispatch__"


class Mode(enum.Enum):
    DP_COMPUTE = "dp_compute"
    ONE_TO_ALL = "one_to_all"
    RANK_ZERO = "rank_zero"
    ALL_TO_ALL = "all_to_all"


@dataclass(frozen=True)
class DispatchSpec:
    """A method's mode and the name of its collector (see ``COLLECTORS``)."""

    mode: Mode
    collect: str


DEFAULT_COLLECT = {Mode.DP_COMPUTE: "concat", Mode.ONE_TO_ALL: "list", Mode.RANK_ZERO: "first",
                   Mode.ALL_TO_ALL: "list"}


def dispatch(mode: Mode, *, collect: str | None = None) -> Callable:
    """Declare how a worker method is dispatched: ``@dispatch(Mode.DP_COMPUTE, collect="mean")``."""
    spec = DispatchSpec(mode, collect or DEFAULT_COLLECT[mode])
    if spec.collect not in COLLECTORS:
        raise ValueError(f"unknown collector {spec.collect!r}; choose from {', '.join(COLLECTORS)}")

    def mark(method: Callable) -> Callable:
        setattr(method, DISPATCH_ATTR, spec)
        return method

    return mark


_TABLES: dict[type, dict[str, DispatchSpec]] = {}


def register_dispatch_table(cls: type, table: dict[str, DispatchSpec]) -> None:
    """Declarations for a class whose methods cannot carry the decorator."""
    _TABLES[cls] = dict(table)


def dispatch_table(cls: type) -> dict[str, DispatchSpec]:
    """Every dispatchable method of ``cls`` (decorated methods, then a registered table; MRO aware)."""
    table: dict[str, DispatchSpec] = {}
    for klass in reversed(cls.__mro__):
        table.update(_TABLES.get(klass, {}))
        for name, member in vars(klass).items():
            if hasattr(member, DISPATCH_ATTR):
                table[name] = getattr(member, DISPATCH_ATTR)
    return table


# ------------------------------------------------------------------ splitting arguments
Call = tuple[tuple, dict]
"""The positional and keyword arguments of one rank's call."""


def _chunk(value: Any, world_size: int) -> list[Any]:
    if not isinstance(value, Batch):
        return [value] * world_size
    if len(value) % world_size:
        raise ConfigError(f"a batch of {len(value)} samples cannot be split evenly over {world_size} data-parallel "
                          f"workers: its size must be a multiple of {world_size}")
    return value.chunk(world_size)


def _split_dp(args: tuple, kwargs: dict, world_size: int) -> list[Call]:
    columns = [_chunk(a, world_size) for a in args]
    kw_columns = {k: _chunk(v, world_size) for k, v in kwargs.items()}
    return [(tuple(c[r] for c in columns), {k: v[r] for k, v in kw_columns.items()}) for r in range(world_size)]


def _split_one_to_all(args: tuple, kwargs: dict, world_size: int) -> list[Call]:
    return [(args, kwargs)] * world_size


def _split_rank_zero(args: tuple, kwargs: dict, world_size: int) -> list[Call]:
    return [(args, kwargs)]


def _split_all_to_all(args: tuple, kwargs: dict, world_size: int) -> list[Call]:
    for value in (*args, *kwargs.values()):
        if not isinstance(value, Sequence) or len(value) != world_size:
            raise ValueError(f"ALL_TO_ALL needs every argument to be a list of {world_size} values (one a rank)")
    return [(tuple(a[r] for a in args), {k: v[r] for k, v in kwargs.items()}) for r in range(world_size)]


SPLITTERS: dict[Mode, Callable[[tuple, dict, int], list[Call]]] = {
    Mode.DP_COMPUTE: _split_dp, Mode.ONE_TO_ALL: _split_one_to_all,
    Mode.RANK_ZERO: _split_rank_zero, Mode.ALL_TO_ALL: _split_all_to_all,
}


# ------------------------------------------------------------------ collecting results
def concat_results(results: list[Any]) -> Any:
    """Rank results stacked in rank order: Batch.concat, torch.cat, element-wise for tuples."""
    first = results[0]
    if first is None:
        return None
    if isinstance(first, Batch):
        return Batch.concat(results)
    if isinstance(first, torch.Tensor):
        return torch.cat(results)
    if isinstance(first, tuple):
        return tuple(concat_results(list(parts)) for parts in zip(*results))
    if isinstance(first, dict):
        return mean_metrics(results)
    raise TypeError(f"cannot concatenate results of type {type(first).__name__}; declare another collector")


def mean_metrics(results: list[dict[str, float]]) -> dict[str, float]:
    """Metric dictionaries averaged key by key over the ranks that reported the key."""
    keys = dict.fromkeys(k for result in results for k in result)
    return {k: sum(float(r[k]) for r in results if k in r) / sum(k in r for r in results) for k in keys}


COLLECTORS: dict[str, Callable[[list[Any]], Any]] = {
    "concat": concat_results,
    "mean": mean_metrics,
    "first": lambda results: results[0],
    "list": list,
}

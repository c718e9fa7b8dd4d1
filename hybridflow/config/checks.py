"""Small checks every section's own checks are made of: one line per problem, naming the key and the fix."""

from __future__ import annotations

import os
from typing import Any

from hybridflow.config.loader import MEGATRON


def check_choice(problems: list[str], key: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        problems.append(f"{key}={value!r} is not one of {', '.join(choices)}")


def check_positive(problems: list[str], key: str, value: Any) -> None:
    if value is not None and value <= 0:
        problems.append(f"{key}={value} must be a positive integer")


def check_output_folder(problems: list[str], key: str, path: str) -> None:
    """A folder the run writes into (checkpoints, logs) cannot be, or lie under, a regular file: said before any
    model loads, not as a NotADirectoryError when the first log or checkpoint is written."""
    full = os.path.abspath(os.path.expanduser(str(path)))
    existing = full
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        where = "is a file" if existing == full else f"lies under the file '{existing}'"
        problems.append(f"{key}='{path}' {where}, not a folder: point it at a folder (the run writes its "
                        "global_step_N checkpoints and logs there)")


def check_strategies(problems: list[str], strategies: dict[str, str]) -> None:
    """verl's training backends: fsdp and fsdp2 both mean FSDP2 here; megatron gets the one line saying so."""
    for key, value in strategies.items():
        if value == "megatron":
            problems.append(f"{key}=megatron: {MEGATRON}")
        else:
            check_choice(problems, key, value, ("fsdp", "fsdp2"))


def check_sp_size(problems: list[str], key: str, size: int, ranks: int, *, packed: bool, packing_key: str,
                  ranks_name: str = "trainer.nnodes x trainer.n_gpus_per_node") -> None:
    """A Ulysses sequence-parallel size: at least 1, a divisor of the group's ranks, over packed rows."""
    if size < 1:
        problems.append(f"{key}={size} must be >= 1")
    if size > 1 and ranks > 1 and ranks % size:
        problems.append(f"{key}={size} must divide the {ranks} ranks of the worker group ({ranks_name})")
    if size > 1 and not packed:
        problems.append(f"{key}={size} splits packed rows over ranks: set {packing_key}=True")

"""A resumable dataloader: its position is part of the checkpoint.

The order of epoch ``e`` is a pure function of ``(seed, e)`` (a permutation drawn
from ``numpy.random.default_rng([seed, e])``), so saving ``{epoch, position, seed}``
is enough to resume at the exact next batch after a crash: the loader rebuilds the
epoch's order and skips the ``position`` samples already handed out. Samples are
read in-process: the datasets tokenise up front, so ``__getitem__`` is a list lookup
and worker processes would only add start-up time and hide the position.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from hybridflow.errors import DataError


def epoch_order(num_samples: int, *, epoch: int, seed: int, shuffle: bool) -> list[int]:
    """Sample order of one epoch: a seeded permutation, or ``0..n-1`` without shuffle."""
    if not shuffle:
        return list(range(num_samples))
    return np.random.default_rng([seed, epoch]).permutation(num_samples).tolist()


class StatefulDataLoader:
    """Batches of ``dataset`` with ``state_dict()`` / ``load_state_dict()`` for exact resume.

    One ``iter()`` walks the rest of the current epoch, then advances ``epoch`` and
    resets ``position`` (samples of this epoch already yielded). ``drop_last`` drops a
    final batch smaller than ``batch_size`` (verl's training default).
    """

    def __init__(
        self,
        dataset,
        *,
        batch_size: int,
        collate_fn: Callable[[list[Any]], Any],
        shuffle: bool = True,
        seed: int = 1,
        drop_last: bool = True,
    ):
        if batch_size <= 0:
            raise DataError(f"batch size must be positive, got {batch_size}; set data.train_batch_size >= 1")
        if drop_last and len(dataset) < batch_size:
            raise DataError(
                f"dataset has {len(dataset)} samples, fewer than one batch of {batch_size}; lower "
                "data.train_batch_size or add data"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.collate_fn = collate_fn
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self.position = 0

    def __len__(self) -> int:
        """Batches in one full epoch."""
        full, rest = divmod(len(self.dataset), self.batch_size)
        return full if self.drop_last or rest == 0 else full + 1

    def __iter__(self) -> Iterator[Any]:
        order = epoch_order(len(self.dataset), epoch=self.epoch, seed=self.seed, shuffle=self.shuffle)
        while self.position < len(order):
            indices = order[self.position : self.position + self.batch_size]
            if self.drop_last and len(indices) < self.batch_size:
                break
            self.position += len(indices)  # counted before yielding: a checkpoint taken now skips this batch
            yield self.collate_fn([self.dataset[i] for i in indices])
        self.epoch += 1
        self.position = 0

    def state_dict(self) -> dict[str, int]:
        """Where the next batch comes from; an epoch with no full batch left counts as finished."""
        smallest_batch = self.batch_size if self.drop_last else 1
        if len(self.dataset) - self.position < smallest_batch:
            return {"epoch": self.epoch + 1, "position": 0, "seed": self.seed}
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        missing = {"epoch", "position", "seed"} - set(state)
        if missing:
            raise DataError(
                f"dataloader state is missing {sorted(missing)}; the checkpoint's dataloader state is incomplete, resume "
                "from another step"
            )
        self.epoch, self.position, self.seed = int(state["epoch"]), int(state["position"]), int(state["seed"])

"""The PPO update loop that both trainable workers run: the actor with its policy loss, the critic
with its value loss (Schulman et al. 2017, "Proximal Policy Optimization Algorithms", Alg. 1: K
epochs of minibatch SGD over the collected batch).

    for epoch in range(ppo_epochs):
        for mini_batch in mini_batches(batch):          # one optimizer step each
            counts = global token / sequence counts of the mini-batch over the data-parallel ranks
            for micro in micro_batches(mini_batch):     # gradient accumulation
                loss = loss_fn(micro)                   # a share of the mini-batch loss (global normalisation)
                (loss x dp_size).backward()             # FSDP averages over ranks: undo the mean
            optimizer step

An :class:`UpdateSchedule` (built from a role's ``ppo_*`` keys by ``trainer/roles/builders.py``) says how the
batch is walked. Mini-batches hold ``mini_batch_size x rows_per_prompt / dp`` rows. With ``shuffle`` the rows are
permuted first by a permutation fixed by (seed, step, epoch) — the same rule for actor and critic, so
a resumed run draws the same mini-batches; without it they are taken in row order. Because each
micro-batch loss is normalised by the mini-batch's global counts, the micro-batch gradients add up
to the mini-batch gradient whatever the micro-batch split or data-parallel size (tests:
``tests/workers/test_update_invariance.py``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from hybridflow.data.batch import Batch
from hybridflow.models.fsdp import micro_batch_sync
from hybridflow.data.parallel import DataParallel
from hybridflow.workers.micro_batches import balanced_token_groups, micro_batches, mini_batches
from hybridflow.workers.optim import TrainState

LossFn = Callable[[Batch], tuple[torch.Tensor, dict[str, float], dict[str, float]]]
"""``loss_fn(micro) -> (loss with gradient, shares, metrics)``: ``shares`` are the micro-batch's parts of
mini-batch sums (added over micro-batches and ranks), ``metrics`` per-micro-batch values (averaged)."""


@dataclass(frozen=True)
class UpdateSchedule:
    """How one update walks its batch: ``epochs`` x mini-batches (one optimizer step each) x micro-batches."""

    mini_batch_size: int
    """Prompts per optimizer step over all data-parallel ranks (verl's ``ppo_mini_batch_size``)."""
    rows_per_prompt: int = 1
    """Rows of one prompt in the batch (``rollout.n``; 2 for a SPIN pair)."""
    epochs: int = 1
    """Passes over the batch (``ppo_epochs``)."""
    shuffle: bool = False
    """Permute the rows before cutting mini-batches (fixed by seed, step, epoch)."""
    micro_batch_size: int | None = None
    """Items per micro-batch on this rank; None: one micro-batch per mini-batch (or the token budget)."""
    use_dynamic_bsz: bool = False
    """Cut micro-batches by ``max_token_len`` tokens instead of a row count (only when ``item_rows`` is 1), as
    verl does: valid tokens per part, parts balanced by workload (``micro_batches.balanced_token_groups``)."""
    max_token_len: int | None = None
    """The token budget of one dynamic micro-batch (``ppo_max_token_len_per_gpu``)."""
    item_rows: int = 1
    """Consecutive rows that stay together (2: a chosen/rejected pair); micro-batch sizes count items."""

    def mini_batch_rows(self, dp: DataParallel) -> int:
        """Rows of one mini-batch on one rank (at least one item)."""
        return max(self.mini_batch_size * self.rows_per_prompt // dp.world_size, self.item_rows)


def ppo_mini_batches(batch: Batch, *, schedule: UpdateSchedule, dp: DataParallel, seed: int,
                     step: int) -> Iterator[tuple[dict[str, float], list[Batch]]]:
    """``(global counts, micro-batches)`` of every optimizer step of one update, in training order."""
    micro_rows = schedule.micro_batch_size and schedule.micro_batch_size * schedule.item_rows
    for epoch in range(schedule.epochs):
        for mini in mini_batches(batch, schedule.mini_batch_rows(dp), shuffle=schedule.shuffle, seed=seed, step=step,
                                 epoch=epoch):
            if schedule.use_dynamic_bsz and schedule.item_rows == 1:
                lengths = mini["attention_mask"].sum(-1).tolist()
                micros = [mini.index_select(rows) for rows in balanced_token_groups(lengths, schedule.max_token_len,
                                                                                   dp=dp)]
            else:
                micros = micro_batches(mini, micro_batch_size=micro_rows)
            yield dp.global_counts(mini["response_mask"]), micros


def optimizer_step(*, state: TrainState, dp: DataParallel, micros: list[Batch], loss_fn: LossFn,
                   metrics: dict[str, list[float]], loss_key: str = "loss") -> None:
    """One optimizer step over a mini-batch's ``micros``; appends the summed shares, the micro-batch metrics'
    mean and ``grad_norm`` to ``metrics`` (one value each per step). ``shares[loss_key]`` is the loss value the
    step checks."""
    state.zero_grad()
    sums: dict[str, float] = defaultdict(float)
    per_micro: dict[str, list[float]] = defaultdict(list)
    for index, micro in enumerate(micros):
        loss, shares, micro_metrics = loss_fn(micro)
        # Gradients are reduced once, in the last micro-batch's backward.
        with micro_batch_sync(state.model, index=index, count=len(micros)):
            (loss * dp.world_size).backward()
        for key, value in shares.items():
            sums[key] += value
        for key, value in micro_metrics.items():
            per_micro[key].append(value)
    # verl's aggregation: a micro-batch metric is averaged within the step, then over steps (mini-batches x epochs)
    for key, values in per_micro.items():
        metrics[key].append(sum(values) / len(values))
    for key, value in sums.items():
        metrics[key].append(float(dp.all_reduce_sum(torch.tensor(value))))
    metrics["grad_norm"].append(state.step(loss_value=metrics[loss_key][-1]))


def averaged(metrics: dict[str, list[float]], *, prefix: str) -> dict[str, float]:
    """Per-step metrics: each list's mean, under ``prefix`` (``rollout_corr/*`` keep verl's names)."""
    return {k if k.startswith("rollout_corr/") else f"{prefix}{k}": sum(v) / len(v) for k, v in metrics.items()}

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

Mini-batches hold ``ppo_mini_batch_size x rows per prompt / dp`` rows. With ``shuffle`` the rows are
permuted first by a permutation fixed by (seed, step, epoch) — the same rule for actor and critic, so
a resumed run draws the same mini-batches; without it they are taken in row order. Because each
micro-batch loss is normalised by the mini-batch's global counts, the micro-batch gradients add up
to the mini-batch gradient whatever the micro-batch split or data-parallel size (tests:
``tests/workers/test_update_invariance.py``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator

import torch

from hybridflow.data.batch import Batch
from hybridflow.models.fsdp import micro_batch_sync
from hybridflow.workers.distributed import DataParallel
from hybridflow.workers.micro_batches import micro_batches, mini_batches
from hybridflow.workers.optim import TrainState

LossFn = Callable[[Batch], tuple[torch.Tensor, dict[str, float], dict[str, float]]]
"""``loss_fn(micro) -> (loss with gradient, shares, metrics)``: ``shares`` are the micro-batch's parts of
mini-batch sums (added over micro-batches and ranks), ``metrics`` per-micro-batch values (averaged)."""


def ppo_mini_batches(batch: Batch, *, cfg, rows_per_prompt: int, dp: DataParallel, seed: int, step: int,
                     micro_batch_size: int | None) -> Iterator[tuple[dict[str, float], list[Batch]]]:
    """``(global counts, micro-batches)`` of every optimizer step of one update, in training order.

    ``cfg``: the actor's or critic's section (``ppo_mini_batch_size``, ``ppo_epochs``, ``shuffle``,
    ``use_dynamic_bsz``, ``ppo_max_token_len_per_gpu``); ``rows_per_prompt``: rollout.n."""
    rows = cfg.ppo_mini_batch_size * rows_per_prompt // dp.world_size
    for epoch in range(cfg.ppo_epochs):
        for mini in mini_batches(batch, rows, shuffle=cfg.shuffle, seed=seed, step=step, epoch=epoch):
            micros = micro_batches(mini, micro_batch_size=micro_batch_size, use_dynamic_bsz=cfg.use_dynamic_bsz,
                                   max_token_len=cfg.ppo_max_token_len_per_gpu, dp=dp)
            yield dp.global_counts(mini["response_mask"]), micros


def optimizer_step(*, state: TrainState, dp: DataParallel, micros: list[Batch], loss_fn: LossFn,
                   metrics: dict[str, list[float]], loss_key: str = "loss") -> None:
    """One optimizer step over a mini-batch's ``micros``; appends the summed shares, the micro-batch
    metrics and ``grad_norm`` to ``metrics``. ``shares[loss_key]`` is the loss value the step checks."""
    state.zero_grad()
    sums: dict[str, float] = defaultdict(float)
    for index, micro in enumerate(micros):
        loss, shares, micro_metrics = loss_fn(micro)
        # Gradients are reduced once, in the last micro-batch's backward.
        with micro_batch_sync(state.model, index=index, count=len(micros)):
            (loss * dp.world_size).backward()
        for key, value in shares.items():
            sums[key] += value
        for key, value in micro_metrics.items():
            metrics[key].append(value)
    for key, value in sums.items():
        metrics[key].append(float(dp.all_reduce_sum(torch.tensor(value))))
    metrics["grad_norm"].append(state.step(loss_value=metrics[loss_key][-1]))


def averaged(metrics: dict[str, list[float]], *, prefix: str) -> dict[str, float]:
    """Per-step metrics: each list's mean, under ``prefix`` (``rollout_corr/*`` keep verl's names)."""
    return {k if k.startswith("rollout_corr/") else f"{prefix}{k}": sum(v) / len(v) for k, v in metrics.items()}
